"""Image transfer hook for `task: custom`: two small image models called autoregressively.

The workflow calls `build(model_path, options, device)` once per shard job and then
`predictor.predict(batch, index)` per batch. The runner owns everything around it: which rows a
shard gets (a contiguous range), batching, writing each returned PNG under a name made from the
row's global index, and proving at gather that every file is there. This file only turns rows into
values, and never writes a file itself.

Two rules keep a row's output the same whichever batch or shard it lands in:

- per-row randomness comes from a CPU `torch.Generator` seeded from (options.seed, global row
  index), never from a shared stream whose position depends on the rows before it;
- the models always run on micro-batches of one fixed size (padded), because kernels may choose
  another algorithm for another batch size (on CPU a batch of one differs in the last bit) and N
  autoregressive steps can turn a last-bit difference into a different pixel.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn

DEFAULTS = {"steps": 20, "seed": 0, "step_size": 0.1, "noise": 0.02, "micro_batch": 8}
MODEL_FILES = ("first", "second")  # models/first.safetensors, models/second.safetensors


class StepNet(nn.Module):
    """A small fully convolutional step model: image plus condition and time planes in, update out.

    The condition and the step's time enter as constant planes so that every step sees them.
    """

    def __init__(self, channels: int = 3, hidden: int = 16, kernel: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels + 2, hidden, kernel, padding=kernel // 2), nn.Tanh(),
            nn.Conv2d(hidden, hidden, kernel, padding=kernel // 2), nn.Tanh(),
            nn.Conv2d(hidden, channels, 1), nn.Tanh())

    def forward(self, x: torch.Tensor, cond: torch.Tensor, time: float) -> torch.Tensor:
        """The update for images `x` (rows, C, H, W) in [-1, 1] under conditions `cond` (rows,)."""
        rows, _, height, width = x.shape
        cond_plane = cond.view(rows, 1, 1, 1).expand(rows, 1, height, width)
        time_plane = torch.full((rows, 1, height, width), time, dtype=x.dtype, device=x.device)
        return self.body(torch.cat([x, cond_plane, time_plane], dim=1))


def decode_png(data: bytes) -> np.ndarray:
    """PNG bytes as an (H, W, 3) uint8 array; grey or RGBA inputs are converted to RGB."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 array as PNG bytes. Pillow writes no timestamp, so equal pixels give
    equal bytes (the gather's SHA-256 and the tests compare bytes)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def row_generator(seed: int, index: int) -> torch.Generator:
    """A CPU generator owned by one row: its noise depends on (seed, global row index) only, so
    neither the batch, the shard nor the device changes it (CUDA generators draw other numbers)."""
    state = np.random.SeedSequence([int(seed), int(index)]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device="cpu").manual_seed(int(state[0]) << 32 | int(state[1]))


def load_model(model_dir: Path, name: str, shape: dict, device: torch.device) -> StepNet:
    """One model from `<name>.safetensors` (safetensors only: loading it runs no code)."""
    model = StepNet(**shape)
    model.load_state_dict(load_file(str(model_dir / f"{name}.safetensors")), strict=True)
    return model.to(device).eval().requires_grad_(False)


class TransferPredictor:
    """What `build` returns: the output columns it declares and a `predict` per batch."""

    outputs = {"image": "file:.png", "mean_change": "float32"}

    def __init__(self, models: list[StepNet], options: dict, device: torch.device) -> None:
        self.models = models
        self.options = {**DEFAULTS, **options}
        self.device = device

    def predict(self, batch: pa.Table, index: np.ndarray) -> dict[str, list]:
        """One PNG and one mean absolute change (in 8-bit levels) per row; None for both where a
        row has no image. `batch` holds input.columns in order: the PNG bytes, then the condition."""
        if batch.num_columns != 2:
            raise ValueError(f"expects input.columns [image, condition], got {batch.column_names}")
        pngs, conds = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        index = np.asarray(index, dtype=np.int64)
        images: list[bytes | None] = [None] * len(pngs)
        changes: list[float | None] = [None] * len(pngs)
        for rows in rows_by_shape(pngs):
            before = np.stack([decode_png(pngs[row]) for row in rows])
            after = self.transfer(before, [condition(conds[row], index[row]) for row in rows], index[rows])
            for row, old, new in zip(rows, before, after):
                images[row] = encode_png(new)
                changes[row] = float(np.abs(new.astype(np.int16) - old).mean())
        return {"image": images, "mean_change": changes}

    def transfer(self, pixels: np.ndarray, conds: list[float], index: np.ndarray) -> np.ndarray:
        """Run same-shape images through the loop in fixed-size micro-batches (see the module
        docstring for why the size is fixed)."""
        size = int(self.options["micro_batch"])
        out = []
        for start in range(0, len(pixels), size):
            chunk = slice(start, start + size)
            out.append(self.run_chunk(pixels[chunk], conds[chunk], index[chunk], size))
        return np.concatenate(out)

    @torch.inference_mode()
    def run_chunk(self, pixels: np.ndarray, conds: list[float], index: np.ndarray, size: int) -> np.ndarray:
        """The autoregressive loop on up to `size` images, padded to exactly `size` rows:
        step t asks model t % 2 for an update and adds the row's own noise."""
        rows = len(pixels)
        x = pad_rows(torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1.0, size)
        cond = pad_rows(torch.tensor(conds, dtype=torch.float32), size)
        x, cond = x.to(self.device), cond.to(self.device)
        generators = [row_generator(self.options["seed"], i) for i in index]
        steps, step_size = int(self.options["steps"]), float(self.options["step_size"])
        for t in range(steps):
            update = self.models[t % 2](x, cond, t / max(steps, 1))
            noise = torch.stack([torch.randn(x.shape[1:], generator=g) for g in generators])
            x[:rows] += step_size * update[:rows] + self.options["noise"] * noise.to(self.device)
            x.clamp_(-1.0, 1.0)
        pixels_out = ((x[:rows] + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        return pixels_out.permute(0, 2, 3, 1).cpu().numpy()


def rows_by_shape(pngs: list[bytes | None]) -> list[np.ndarray]:
    """Positions of the rows that have an image, grouped by image size (a batch stacks one size).
    Reads only each PNG's header."""
    groups: dict[tuple[int, int], list[int]] = {}
    for row, data in enumerate(pngs):
        if data is not None:
            with Image.open(io.BytesIO(data)) as image:
                groups.setdefault(image.size, []).append(row)
    return [np.array(rows, dtype=np.int64) for rows in groups.values()]


def condition(value: float | None, index: int) -> float:
    """A row's condition as a float; a missing or non-finite one is refused, naming the row."""
    if value is None or not np.isfinite(value):
        raise ValueError(f"row {int(index)}: condition is {value!r}; expected a finite number")
    return float(value)


def pad_rows(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `size` rows (the padding's outputs are dropped)."""
    missing = size - tensor.shape[0]
    return torch.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))]) if missing else tensor


def build(model_path: str | None, options: dict, device: torch.device) -> TransferPredictor:
    """The entry point (`model.entrypoint: hooks/transfer.py:build`), called once per shard job:
    loads both models from `model_path` (config.json for their shapes) onto `device`."""
    if model_path is None:
        raise ValueError("this hook needs model.path: the folder make_example.py wrote (models/)")
    options = dict(options or {})
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown model.options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    model_dir = Path(model_path)
    shapes = json.loads((model_dir / "config.json").read_text())["models"]
    models = [load_model(model_dir, name, shapes[name], device) for name in MODEL_FILES]
    return TransferPredictor(models, options, device)
