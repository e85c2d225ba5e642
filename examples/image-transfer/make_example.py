"""Build the image-transfer example's inputs with no download: two small random-weight image
models (safetensors) and a parquet table of procedurally drawn 32x32 PNGs with a condition each.

    python make_example.py                 # writes models/ and data/images.parquet here
    python make_example.py --rows 480 --out /tmp/image-transfer

The models stand in for your trained ones: their architecture is the hook's own `StepNet`
(hooks/transfer.py), so the hook loads exactly what is saved here. Everything is seeded, so two
runs write the same bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SIZE = 32
# The two models' shapes, written to models/config.json for the hook: a "denoiser" and a "refiner".
SHAPES = {"first": {"channels": 3, "hidden": 16, "kernel": 3}, "second": {"channels": 3, "hidden": 12, "kernel": 5}}


def load_hook(path: Path = HERE / "hooks" / "transfer.py") -> ModuleType:
    """The hook module, imported from its file the way the workflow's `entrypoint` names it."""
    spec = importlib.util.spec_from_file_location("image_transfer_hook", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # registered before it runs, as a normal import would be
    spec.loader.exec_module(module)
    return module


def build_models(models_dir: Path, seed: int = 0) -> list[Path]:
    """Random-weight models with a fixed seed, saved as safetensors (no pickle), plus config.json
    with their shapes. Returns the weight files written."""
    import torch
    from safetensors.torch import save_file

    hook = load_hook()
    models_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for offset, (name, shape) in enumerate(SHAPES.items()):
        torch.manual_seed(seed + offset)
        model = hook.StepNet(**shape)
        path = models_dir / f"{name}.safetensors"
        save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(path),
                  metadata={"format": "pt"})
        written.append(path)
    config = {"models": SHAPES, "image_size": [SIZE, SIZE], "made_by": "make_example.py", "seed": seed}
    (models_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return written


def draw_image(rng: np.random.Generator, size: int = SIZE) -> np.ndarray:
    """A (size, size, 3) uint8 picture: a two-colour gradient with a disc and a bar on it, so that
    the models have edges and flat areas to change."""
    y, x = np.mgrid[0:size, 0:size] / (size - 1)
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    cos, sin = np.cos(angle), np.sin(angle)
    ramp = (cos * x + sin * y - min(0, cos) - min(0, sin)) / (abs(cos) + abs(sin))  # 0..1 along `angle`
    image = start + (end - start) * ramp[..., None]
    cy, cx, radius = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.1, 0.3)
    image[(y - cy) ** 2 + (x - cx) ** 2 < radius**2] = rng.uniform(0, 255, 3)
    row = rng.integers(0, size - 4)
    image[row:row + 3, :] = rng.uniform(0, 255, 3)
    return np.clip(image, 0, 255).round().astype(np.uint8)


def build_input(path: Path, rows: int, seed: int = 0) -> pa.Table:
    """The input table: `id` (string), `img` (PNG bytes), `cond` (float64 in [0, 1])."""
    hook = load_hook()
    rng = np.random.default_rng(seed)
    images = [hook.encode_png(draw_image(rng)) for _ in range(rows)]
    table = pa.table({
        "id": pa.array([f"img-{row:05d}" for row in range(rows)], pa.string()),
        "img": pa.array(images, pa.binary()),
        "cond": pa.array(rng.uniform(0, 1, rows).round(3), pa.float64()),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return table


def make_example(out: Path, rows: int = 48, seed: int = 0) -> dict[str, Path]:
    """Everything the example's config.yaml reads, under `out`: models/ and data/images.parquet."""
    build_models(out / "models", seed)
    build_input(out / "data" / "images.parquet", rows, seed)
    return {"models": out / "models", "input": out / "data" / "images.parquet"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48, help="input rows (default 48)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write models/ and data/ into "
                        "(default: this example's folder)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and images (default 0)")
    args = parser.parse_args(argv)
    paths = make_example(args.out, args.rows, args.seed)
    print(f"wrote {paths['models']}/ (first.safetensors, second.safetensors, config.json) "
          f"and {paths['input']} ({args.rows} rows)")


if __name__ == "__main__":
    main()
