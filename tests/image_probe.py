"""Task generate with images on vLLM's engine beside vLLM's own `LLM.chat`, in a process of its own
(the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/image_probe.py <the vLLM images run's folder> <out.json>

With that run's settings (as the Snakefile builds them), it writes the task's prompt ids of each
row whose text does not place its images (`<image>`) and that the task does not refuse, and the
prompt ids `LLM.chat` makes on the same engine of the row as a user message: its images as
image parts in front of its text, or its text alone (a row without an image). tests/test_images.py
compares them.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path


def main(workdir: str, out: str) -> None:
    import pyarrow.parquet as pq
    import torch
    from PIL import Image
    from vllm import SamplingParams

    from generation_data import settings_of
    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.task import Generate

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`)
    settings = settings_of(Path(workdir))
    table = pq.read_table(settings.input.path)
    engine = VllmGenerate.load(Generate, LoadContext(settings, torch.device("cpu"), torch.float32))
    window = engine.task.prepare(0, table.select(list(settings.input.task_columns)))
    rows, conversations = [], []
    for i, (text, images) in enumerate(zip(table.column("text").to_pylist(), table.column("image").to_pylist())):
        if "<image>" in text or i in window.data.refused:
            continue
        parts = [{"type": "image_pil", "image_pil": Image.open(io.BytesIO(image)).convert("RGB")} for image in images]
        rows.append(i)
        conversations.append([{"role": "user", "content": [*parts, {"type": "text", "text": text}] if parts else text}])
    outputs = engine.llm.chat(conversations, SamplingParams(max_tokens=1), use_tqdm=False)
    Path(out).write_text(json.dumps({"rows": rows, "ours": [list(map(int, window.data.ids[i])) for i in rows],
                                     "chat": [list(output.prompt_token_ids) for output in outputs]}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
