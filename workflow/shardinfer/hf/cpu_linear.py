"""Float32 linear layers on a CPU through oneDNN, their weights packed once at load.

On a CPU torch runs a float32 `nn.Linear` as MKL's sgemm, which lays the weight out for its kernel
again on every call. oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, what torch.compile's
CPU backend calls) takes a weight laid out once (`_reorder_linear_weight`). An encoder's work is
nearly all linear layers, so the one-pass tasks (embed, classify, score, token-classify) pack
theirs when they run on a CPU (docs/performance.md has the figures).

The packing is checked on the model itself before it is kept: a short batch through the model
before and after must agree to float32 rounding, else every layer is put back (the same values,
bias and ties). That covers a torch build whose oneDNN cannot take a layer and model code that
reads a linear layer's `weight` (T5's feed-forward): such a model runs on torch's layers as before.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from shardinfer.core.errors import first_line

log = logging.getLogger(__name__)

# How far the packed model's outputs may move from torch's: float32 sums in another order.
RTOL, ATOL = 1e-4, 1e-5


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` whose weight oneDNN laid out once; `unpacked()` gives the plain layer back."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_requires_grad = linear.weight.requires_grad
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def unpacked(self) -> torch.nn.Linear:
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
        with torch.no_grad():
            linear.weight = torch.nn.Parameter(self.packed.to_dense(), requires_grad=self.weight_requires_grad)
        linear.bias = self.bias
        return linear


def onednn_linear_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._linear_pointwise) and callable(torch.ops.mkldnn._reorder_linear_weight)
    except (AttributeError, RuntimeError):
        return False


def plain_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(parent, name) of every float32 `nn.Linear` itself, without hooks (a subclass, such as a
    quantized or adapter layer, and a hooked layer have code of their own), under each of its names
    (`named_children()` would give a layer two parents share once)."""
    return [(parent, name) for parent in model.modules() for name, child in parent._modules.items()
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32
            and not (child._forward_hooks or child._forward_pre_hooks)]


def first_tensor(outputs: Any) -> torch.Tensor:
    """The tensor a task reads first from the model's outputs: a ModelOutput's or tuple's first,
    or its `logits` or `last_hidden_state`."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, (tuple, list)) or hasattr(outputs, "to_tuple"):
        return first_tensor(outputs[0])
    for name in ("logits", "last_hidden_state"):
        if isinstance(getattr(outputs, name, None), torch.Tensor):
            return getattr(outputs, name)
    raise TypeError(f"outputs of type {type(outputs).__name__}")


def pack_cpu_linears(model: torch.nn.Module, probe: dict[str, torch.Tensor]) -> int:
    """Swap the model's float32 `nn.Linear` layers for oneDNN-packed ones where `probe` (a batch of
    the model's inputs) gives the same outputs through both; how many were swapped (0: none kept)."""
    where = plain_linears(model)
    if not where or not onednn_linear_available():
        return 0
    layers = len({id(getattr(parent, name)) for parent, name in where})
    try:
        with torch.inference_mode():
            before = first_tensor(model(**probe))
    except Exception as error:  # the model as loaded: the task's own batches will say what is wrong
        log.info("linear layers left to torch on this CPU: the probe batch failed (%s)", error_line(error))
        return 0
    fault = packed_fault(model, probe, before, where)
    if fault is not None:
        restore(where)
        log.info("linear layers left to torch on this CPU: %s", fault)
        return 0
    log.info("%d linear layers packed for oneDNN on this CPU", layers)
    return layers


def packed_fault(model: torch.nn.Module, probe: dict[str, torch.Tensor], before: torch.Tensor,
                 where: list[tuple[torch.nn.Module, str]]) -> str | None:
    """Pack the layers at `where` (one packed layer for a layer two parents share) and say why the
    packed model may not stand in for torch's, or None."""
    packed: dict[int, PackedLinear] = {}
    try:
        for parent, name in where:
            linear = getattr(parent, name)
            if id(linear) not in packed:
                packed[id(linear)] = PackedLinear(linear)
            setattr(parent, name, packed[id(linear)])
        with torch.inference_mode():
            after = first_tensor(model(**probe))
    except Exception as error:  # whatever oneDNN or the model's code does with a layer it did not expect
        return f"{error_line(error)}, with them packed"
    if after.shape != before.shape:
        return f"outputs of shape {tuple(after.shape)} instead of {tuple(before.shape)} with them packed"
    if not torch.allclose(after, before, rtol=RTOL, atol=ATOL, equal_nan=True):
        return f"outputs moved by {(after - before).abs().max().item():.1e} with them packed"
    return None


def restore(where: list[tuple[torch.nn.Module, str]]) -> None:
    """Put torch's layers back where packed ones stand (one layer again for a shared one)."""
    plain: dict[int, torch.nn.Linear] = {}
    for parent, name in where:
        layer = getattr(parent, name)
        if isinstance(layer, PackedLinear):
            if id(layer) not in plain:
                plain[id(layer)] = layer.unpacked()
            setattr(parent, name, plain[id(layer)])


def error_line(error: Exception) -> str:
    return f"{type(error).__name__}: {first_line(error)}"
