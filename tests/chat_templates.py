"""Chat templates of the shapes found on the Hub, each with the content format vLLM's rule gives it
("openai": a loop over a message's content; "string" otherwise): tests/test_chat_content.py checks
`shardinfer.tasks.generate.chat_content.content_format` against them, and tests/generation_probe.py asks
vLLM's own detector about each (and about the templates vLLM ships)."""

from tiny_models import BYTES_CHAT_TEMPLATE, CHAT_TEMPLATE, PARTS_CHAT_TEMPLATE
from tiny_vlm import VLM_CHAT_TEMPLATE

# SmolVLM's (and Idefics3's) default template, as transformers' processors carry it.
SMOLVLM = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]"
           "['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if "
           "line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
           "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_VL = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
            "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
            "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}"
            "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}")
QWEN3 = ("{%- for message in messages %}{%- set content = message.content %}{%- if message.role == 'assistant' %}"
         "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
         "{%- endif %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}{%- endfor %}")

TEMPLATES = {
    "tiny": (CHAT_TEMPLATE, "string"),
    "tiny bytes": (BYTES_CHAT_TEMPLATE, "string"),
    "tiny parts": (PARTS_CHAT_TEMPLATE, "openai"),
    "tiny vlm": (VLM_CHAT_TEMPLATE, "openai"),
    "smolvlm": (SMOLVLM, "openai"),
    "llama3": (LLAMA3, "string"),
    "qwen2-vl": (QWEN2_VL, "openai"),
    "qwen3": (QWEN3, "string"),
    "macro parameter": ("{% macro show(parts) %}{% for p in parts %}{{ p.text }}{% endfor %}{% endmacro %}"
                        "{% for m in messages %}{{ show(m['content']) }}{% endfor %}", "openai"),
    "macro keyword": ("{% macro show(x, parts=none) %}{% for p in parts %}{{ p.text }}{% endfor %}{% endmacro %}"
                      "{% for m in messages %}{{ show(1, parts=m.content) }}{% endfor %}", "openai"),
    "loop named content in a macro": ("{% macro show(x) %}{% for p in content %}{{ p }}{% endfor %}{% endmacro %}"
                                      "{% for m in messages %}{{ show(m.content) }}{% endfor %}", "string"),
    "content variable": ("{% for m in messages %}{% set content = m['content'] %}{% for p in content %}"
                         "{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    "messages alias, sliced and filtered": ("{% set msgs = messages %}{% for m in msgs[1:] %}"
                                            "{% for p in m.content | list %}{{ p.text }}{% endfor %}{% endfor %}",
                                            "openai"),
    "first part only, no loop": ("{% for m in messages %}{{ m['content'][0]['text'] }}{% endfor %}", "string"),
    "two loop variables": ("{% for m in messages %}{% for a, b in m.content %}{{ a }}{% endfor %}{% endfor %}",
                           "string"),
    "namespace assignment": ("{% set ns = namespace(x=1) %}{% set ns.x = messages %}{% for m in messages %}"
                             "{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}", "string"),
    "generation tag": ("{% for m in messages %}{% generation %}{% for p in m['content'] %}{{ p.text }}{% endfor %}"
                       "{% endgeneration %}{% endfor %}", "openai"),
    "syntax error": ("{% for m in messages %}{{ m.content }", "string"),
}
