"""Float32 linear layers on a CPU through oneDNN, their weights packed once at load.

On a CPU torch runs a float32 `nn.Linear` as MKL's sgemm, which lays the weight out for its kernel
again on every call. oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, what torch.compile's
CPU backend calls) takes a weight laid out once (`_reorder_linear_weight`). An encoder's work is
nearly all linear layers, so the one-pass tasks (embed, classify, score, token-classify) pack
theirs when they run on a CPU (docs/performance.md has the figures).

The packing is checked on the model itself before it is kept: a short batch through the model
before and after must agree to float32 rounding, else every layer is put back as it was. That
covers a torch build without oneDNN's ops and model code that reads a linear layer's `weight`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

# How far the packed model's outputs may move from torch's: float32 sums in another order.
RTOL, ATOL = 1e-4, 1e-5


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` whose weight oneDNN laid out once; `unpacked()` gives the plain layer back."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def unpacked(self) -> torch.nn.Linear:
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = torch.nn.Parameter(self.packed.to_dense(), requires_grad=False)
        if self.bias is not None:
            linear.bias = torch.nn.Parameter(self.bias, requires_grad=False)
        return linear


def onednn_linear_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._linear_pointwise) and callable(torch.ops.mkldnn._reorder_linear_weight)
    except (AttributeError, RuntimeError):
        return False


def plain_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(parent, name) of every float32 `nn.Linear` itself (not a subclass: a quantized or adapter
    layer has code of its own)."""
    return [(parent, name) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32]


def first_output(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, (tuple, list)) or hasattr(outputs, "to_tuple") else outputs


def pack_cpu_linears(model: torch.nn.Module, probe: dict[str, torch.Tensor]) -> int:
    """Swap the model's float32 `nn.Linear` layers for oneDNN-packed ones where `probe` (a batch of
    the model's inputs) gives the same outputs through both; how many were swapped (0: none kept)."""
    where = plain_linears(model)
    if not where or not onednn_linear_available():
        return 0
    with torch.inference_mode():
        before = first_output(model(**probe))
        for parent, name in where:
            setattr(parent, name, PackedLinear(getattr(parent, name)))
        fault = packed_fault(model, probe, before)
        if fault is not None:
            for parent, name in where:
                setattr(parent, name, getattr(parent, name).unpacked())
            log.info("linear layers left to torch on this CPU: %s", fault)
            return 0
    log.info("%d linear layers packed for oneDNN on this CPU", len(where))
    return len(where)


def packed_fault(model: torch.nn.Module, probe: dict[str, torch.Tensor], before: torch.Tensor) -> str | None:
    """Why the packed model may not stand in for torch's, or None."""
    try:
        after = first_output(model(**probe))
    except Exception as error:  # whatever the model's code does with a layer it did not expect
        return f"{type(error).__name__} in the model's forward pass with them packed"
    if after.shape != before.shape:
        return f"outputs of shape {tuple(after.shape)} instead of {tuple(before.shape)} with them packed"
    if not torch.allclose(after, before, rtol=RTOL, atol=ATOL, equal_nan=True):
        return f"outputs moved by {(after - before).abs().max().item():.1e} with them packed"
    return None
