"""Linear layers packed for oneDNN on a CPU (shardinfer.hf.cpu_linear): kept only where the model
gives the same outputs through them, put back exactly as they were otherwise."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from shardinfer.hf.cpu_linear import PackedLinear, pack_cpu_linears

CONFIG = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny_bert(**extra) -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(**CONFIG, **extra)).eval()


def probe() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[2, 15, 27, 41, 3], [2, 8, 3, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]


def test_an_encoder_runs_on_packed_layers_with_the_same_outputs():
    model, inputs = tiny_bert(), probe()
    with torch.inference_mode():
        before = model(**inputs).last_hidden_state
    assert pack_cpu_linears(model, inputs) == 2 * 6 + 1  # q, k, v, o, up, down per layer; the pooler
    assert all(isinstance(m, PackedLinear) for m in linears(model))
    longer = {"input_ids": torch.randint(4, 100, (7, 19)), "attention_mask": torch.ones(7, 19, dtype=torch.long)}
    reference = tiny_bert()
    with torch.inference_mode():
        torch.testing.assert_close(model(**inputs).last_hidden_state, before, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(**longer).last_hidden_state, reference(**longer).last_hidden_state,
                                   rtol=1e-4, atol=1e-5)


class ReadsWeights(torch.nn.Module):
    """Model code that reads a linear layer's weight, as some transformers models do (T5's dtype check)."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = tiny_bert()

    def forward(self, **inputs):
        hidden = self.bert(**inputs).last_hidden_state
        return (hidden.to(self.bert.pooler.dense.weight.dtype),)


def test_a_model_whose_code_reads_a_layers_weight_keeps_torchs_layers_as_they_were():
    model, inputs = ReadsWeights(), probe()
    weights = {name: p.clone() for name, p in model.named_parameters()}
    with torch.inference_mode():
        before = model(**inputs)[0]
    assert pack_cpu_linears(model, inputs) == 0
    assert all(type(m) is torch.nn.Linear for m in linears(model))
    assert {name: p for name, p in model.named_parameters()}.keys() == weights.keys()
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), name
    with torch.inference_mode():
        assert torch.equal(model(**inputs)[0], before)


def test_outputs_that_move_keep_torchs_layers(monkeypatch):
    model, inputs = tiny_bert(), probe()
    packed_forward = PackedLinear.forward
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: packed_forward(self, x) * 1.001)  # wrong, no error
    assert pack_cpu_linears(model, inputs) == 0
    assert all(type(m) is torch.nn.Linear for m in linears(model))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layers_not_in_float32_are_left_alone(dtype):
    model = tiny_bert().to(dtype)
    assert pack_cpu_linears(model, probe()) == 0
    assert all(type(m) is torch.nn.Linear for m in linears(model))
