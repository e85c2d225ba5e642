"""What `<task>.engine: vllm` is refused for the encoder tasks (embed, classify, score,
token-classify) before any job runs: the checks every vLLM engine takes (`checks.check_vllm_settings`:
installed, no argument the workflow sets, on the CPU build a head size its attention runs), one
device per engine, an adapter only where vLLM's pooling runner loads one (embed), a model folder
whose class has the task's head, and none that vLLM would read otherwise than the transformers
engine: sentence-transformers modules (modules.json) that add a Dense projection to embeddings, or
pool a classifier's inputs their own way. Torch-free, vLLM-free: the Snakefile calls these when it
loads.

What the pooling runner is handed, so that both engines agree (`pooling.VllmPooling`): the rows'
token ids as the task made them (truncation at model.max_length, a pair's token types), the pooling
`embed.pooling` names (`POOLING_TYPES`), and raw outputs, which the task normalises or turns into
probabilities itself (`Task.from_pooled`).
"""

from __future__ import annotations

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import (
    architectures,
    max_positions,
    sentence_max_length,
    sentence_module_config,
    sentence_modules,
)
from shardinfer.engines.vllm.checks import OWNED_ARGUMENTS, PARALLEL_SIZES, check_lora, check_vllm_settings

# LLM(...) arguments the workflow sets itself for a pooling task (refused in `<task>.vllm`).
POOLING_OWNED = {**{key: OWNED_ARGUMENTS[key] for key in ("model", "tokenizer", "dtype", "trust_remote_code",
                                                          "enable_lora", "max_lora_rank", "max_loras",
                                                          "skip_tokenizer_init")},
                 "max_model_len": "model.max_length", "seed": "the workflow (0)",
                 "runner": "the task (vLLM's pooling runner)", "convert": "the task (embed, classify)",
                 "pooler_config": "the task and embed.pooling (the engine returns raw outputs, the task normalises)"}
# embed.pooling as vLLM's sequence pooling types
POOLING_TYPES = {"mean": "MEAN", "cls": "CLS", "last": "LAST"}
# The model class each task needs (config.json's `architectures`), as transformers' Auto class for it
# loads it: vLLM runs the head the class names (a classifier's, a tagger's) or, for embed, the base model.
HEADS = {"classify": "ForSequenceClassification", "score": "ForSequenceClassification",
         "token-classify": "ForTokenClassification"}
EMBEDDERS = ("Model", "ForCausalLM")  # a base model, or a decoder vLLM embeds with (its hidden states pooled)


def check_pooling_settings(settings) -> None:
    """Before any job runs: what `<task>.engine: vllm` for an encoder task cannot run as the
    transformers engine runs it, each refused in one line naming the key and the way out."""
    task, model, options = settings.model.task, settings.model, settings.task_settings
    check_vllm_settings(model.path, None, options, task, POOLING_OWNED)
    for key in (*PARALLEL_SIZES, "nnodes"):  # one device per engine: no engine over GPUs or machines
        value = (options.get("vllm") or {}).get(key)
        if value not in (None, 1):
            raise UserError(f"{task}.vllm.{key} is {value!r}; vLLM's pooling runner runs the model on one device "
                            "per shard job here: run more shards instead (`shards:`)")
    check_adapter(task, model.adapter)
    check_head(task, model.path)
    check_modules(task, model.path)


def check_adapter(task: str, adapter: str | None) -> None:
    """An adapter is a LoRA for embed (vLLM's embedding models take one); a classifier's adapter
    carries the head vLLM's pooling runner cannot load."""
    if adapter is None:
        return
    if task != "embed":
        raise UserError(f"model.adapter with {task}.engine vllm: vLLM's pooling runner loads no adapter for a "
                        f"{task} model (nor the head it carries); use {task}.engine transformers, or merge the "
                        "adapter into the model")
    check_lora(adapter)


def check_head(task: str, path: str) -> None:
    """A model class with the task's head (a classifier for classify and score, a tagger for
    token-classify), or for embed one without a head: vLLM runs the class config.json names."""
    names = architectures(path)
    if not names:  # vLLM says what it cannot run when it starts
        return
    name = names[0]
    if task in HEADS and not name.endswith(HEADS[task]):
        raise UserError(f"{task}.engine vllm: model.path `{path}` is a {name}, not a *{HEADS[task]} model, which "
                        f"vLLM's pooling runner needs for task {task}; use a model with that head or {task}.engine "
                        "transformers")
    if task == "embed" and not name.endswith(EMBEDDERS):
        raise UserError(f"embed.engine vllm: model.path `{path}` is a {name}; vLLM's pooling runner embeds with a "
                        "base model (*Model) or a decoder (*ForCausalLM), where the transformers engine takes the base "
                        "model out of any class; save the base model (model.base_model.save_pretrained) or use "
                        "embed.engine transformers")


def check_modules(task: str, path: str) -> None:
    """sentence-transformers modules (modules.json) that vLLM would apply and the transformers
    engine does not: a Dense projection of the embeddings, or a Pooling module by which vLLM would
    pool a classifier's inputs (transformers' classes pool as their own code says)."""
    for module in sentence_modules(path):
        kind = str(module.get("type", ""))
        where = f"model.path `{path}` has a sentence-transformers {kind.rsplit('.', 1)[-1]} module " \
                f"(`{module.get('path') or '.'}`, modules.json)"
        if task == "embed" and kind.endswith(".Dense"):  # sentence-transformers' (any version's) and pylate's
            features = sentence_module_config(path, module).get("out_features")
            raise UserError(f"{where}, which vLLM's pooling runner applies to each embedding (to {features} "
                            "dimensions) and the transformers engine does not; use embed.engine transformers")
        if task != "embed" and kind.endswith(".Pooling"):
            raise UserError(f"{where}, by which vLLM's pooling runner would pool the {task} head's inputs where the "
                            f"transformers engine pools as the model class does; use {task}.engine transformers")


def long_max_length(path: str, max_length: int) -> bool:
    """Whether model.max_length is above the limit sentence-transformers' config says
    (max_seq_length), which vLLM takes as the model's: allowed (the engine is told so,
    VLLM_ALLOW_LONG_MAX_MODEL_LEN) where the model's positions hold it, as the transformers engine
    runs it (`text.check_max_length` refuses what they do not hold)."""
    limit, positions = sentence_max_length(path), max_positions(path)
    return limit is not None and max_length > limit and (positions is None or max_length <= positions)
