"""Task generate's features on vLLM's engine, driven as the shard runner drives it, in a process of its
own (the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/generation_probe.py <the sampled run's folder> <out folder>

With the settings of that run's config (as the Snakefile builds them), it writes Parquet tables
for tests/test_generation.py to compare: `one_window` (every row in one engine call: what one shard
computes), `n4` (4 samples per row), `reversed` (2 samples, the windows in reverse order), `subset`
(rows 5..8 alone), `greedy` (greedy, top 2 log-probabilities), `choice` (greedy, a choice among
CHOICES) and `cut` (json within 6 new tokens). `n4`, `greedy`, `choice` and `cut` give every row
parameters of its own (`PromptRows.params`), as a per-row input would. Then `chat.json`
(`chat_facts`): vLLM's `LLM.chat` prompt ids on the same engine beside the task's, and vLLM's own
content format of tests/chat_templates.py's templates and of those vLLM ships.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main(workdir: str, out: str) -> None:
    import pyarrow.parquet as pq
    import torch

    from generation_data import CHOICES, run_window, settings_of
    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.params import RowParams
    from shardinfer.tasks.generate.task import Generate

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    settings = settings_of(Path(workdir))
    table = pq.read_table(settings.input.path).select(list(settings.input.task_columns))
    engine = VllmGenerate.load(Generate, LoadContext(settings, torch.device("cpu"), torch.float32))
    base = RowParams.of(settings)
    half = table.num_rows // 2
    tables = {
        "one_window": run_window(engine, table),
        "n4": run_window(engine, table, params=dataclasses.replace(base, n=4)),
        "reversed": pa_concat([run_window(engine, table.slice(half), half), run_window(engine, table.slice(0, half))]),
        "subset": run_window(engine, table.slice(5, 4), 5),
        "greedy": run_window(engine, table, params=greedy(base)),
        "choice": run_window(engine, table, params=dataclasses.replace(base, do_sample=False, n=1, logprobs=None,
                                                                      structured={"choice": CHOICES})),
        "cut": run_window(engine, table, params=dataclasses.replace(base, max_new_tokens=6)),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, result in tables.items():
        pq.write_table(result, Path(out) / f"{name}.parquet")
    (Path(out) / "chat.json").write_text(json.dumps(chat_facts(engine, table)))


SYSTEM = "answer in json"
TEXTS = ["the cat sat", "big red house and a small boat", "happy"]
# Batch lines' messages: a string, text parts, a system message.
LINES = [[{"role": "user", "content": "the cat sat"}],
         [{"role": "user", "content": [{"type": "text", "text": "red"}, {"type": "text", "text": " cat"}]}],
         [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "go"}]}]]


def chat_facts(engine, table) -> dict:
    """`LLM.chat`'s prompt ids (one new token each, on the task's engine) beside the task's: the rows
    that fit max_length as given (the Parquet's text parts) and as strings, TEXTS under the chat
    template with SYSTEM, and LINES as batch lines; row 1 rendered; vLLM's content formats."""
    import pyarrow as pa
    import vllm
    from vllm import SamplingParams

    from chat_templates import TEMPLATES
    from shardinfer.input.formats.openai_batch import line_of
    from shardinfer.tasks.generate.chat_content import vllm_content_format
    from shardinfer.tasks.generate.prompts import Conversations, prompt_token_ids, text_prompts

    def chat(conversations: list) -> list[list[int]]:
        outputs = engine.llm.chat(conversations, SamplingParams(max_tokens=1), use_tqdm=False)
        return [list(output.prompt_token_ids) for output in outputs]

    task = engine.task
    window = task.prepare(0, table)
    rows = [i for i in range(window.rows) if i not in window.truncated]
    given = [table.column("messages")[i].as_py() for i in rows]
    strings = [[{**m, "content": "".join(p["text"] for p in m["content"])} for m in c] for c in given]
    max_length = task.settings.model.max_length
    prompts, _ = text_prompts(task.tokenizer, pa.array(TEXTS), False, True, SYSTEM, task.form)
    lines = [line_of(json.dumps({"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": m}}).encode(),
                     {})[0]["messages"] for m in LINES]
    conversations = Conversations(task.tokenizer, max_length, None, "lines", task.form)
    shipped = Path(vllm.__file__).parent / "transformers_utils" / "chat_templates"
    templates = {**{name: template for name, (template, _) in TEMPLATES.items()},
                 **{path.name: path.read_text() for path in sorted(shipped.glob("*.jinja"))}}
    return {"rows": rows, "ours": [list(map(int, window.data.ids[i])) for i in rows],
            "chat_given": chat(given), "chat_strings": chat(strings),
            "decoded": task.tokenizer.decode(window.data.ids[1]),
            "texts_ours": prompt_token_ids(task.tokenizer, prompts, max_length, True)[0],
            "texts_chat": chat([[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
                                for text in TEXTS]),
            "lines_ours": [conversations.fitted(messages)[0] for messages in lines], "lines_chat": chat(LINES),
            "formats": {name: [template, vllm_content_format(template)] for name, template in templates.items()}}


def greedy(base):
    """The sampled run's parameters, greedy, one completion per row, the top 2 log-probabilities."""
    return dataclasses.replace(base, do_sample=False, n=1, logprobs=2)


def pa_concat(tables):
    import pyarrow as pa

    return pa.concat_tables(tables)


if __name__ == "__main__":
    main(*sys.argv[1:3])
