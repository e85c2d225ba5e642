"""Linear layers packed for oneDNN on a CPU (shardinfer.hf.cpu_linear): kept only where the model
gives the same outputs through them, put back exactly as they were otherwise."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import BertConfig, BertModel

from factory import settings_for
from shardinfer.hf import cpu_linear
from shardinfer.hf.cpu_linear import PackedLinear, pack_cpu_linears
from shardinfer.settings.config import BatchSettings, ModelSettings
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.classify import Classify

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


def assert_as_loaded(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Torch's own layers with the parameters they had: names, values, requires_grad, usable by autograd."""
    assert all(type(m) is torch.nn.Linear for m in linears(model))
    assert dict(model.named_parameters()).keys() == weights.keys()
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]) and p.requires_grad and not p.is_inference(), name


def test_a_model_whose_code_reads_a_layers_weight_keeps_torchs_layers_as_they_were():
    model, inputs = ReadsWeights(), probe()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.inference_mode():
        before = model(**inputs)[0]
    assert pack_cpu_linears(model, inputs) == 0
    assert_as_loaded(model, weights)
    with torch.inference_mode():
        assert torch.equal(model(**inputs)[0], before)
    model(**inputs)[0].sum().backward()  # outside inference mode too


class Shared(torch.nn.Module):
    """One layer under two names (tied), and a forward that refuses a batch of more than one row."""

    def __init__(self, reads_weight: bool = False, one_row: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)
        self.first = torch.nn.Linear(8, 8)
        self.second = self.first
        self.reads_weight, self.one_row = reads_weight, one_row

    def forward(self, input_ids, attention_mask):
        if self.one_row and len(input_ids) > 1:
            raise ValueError("one row at a time")
        hidden = self.second(self.first(self.embed(input_ids)))
        return (hidden * self.first.weight.sum() if self.reads_weight else hidden,)


@pytest.mark.parametrize("reads_weight", [False, True])
def test_a_layer_two_parents_share_is_packed_once_and_put_back_once(reads_weight):
    model = Shared(reads_weight)
    assert pack_cpu_linears(model, probe()) == (0 if reads_weight else 1)
    assert model.first is model.second
    assert isinstance(model.first, torch.nn.Linear if reads_weight else PackedLinear)


def test_a_probe_the_model_refuses_leaves_it_as_loaded():
    model = Shared(one_row=True)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert pack_cpu_linears(model, probe()) == 0
    assert_as_loaded(model, weights)


def test_a_layer_onednn_cannot_pack_puts_back_those_packed_before_it(monkeypatch):
    model, inputs = tiny_bert(), probe()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    built, init = [], PackedLinear.__init__

    def fails_at_the_fifth(self, linear):
        built.append(linear)
        if len(built) == 5:
            raise RuntimeError("could not create a primitive descriptor")
        init(self, linear)

    monkeypatch.setattr(PackedLinear, "__init__", fails_at_the_fifth)
    assert pack_cpu_linears(model, inputs) == 0
    assert_as_loaded(model, weights)


@dataclass
class Hidden:
    last_hidden_state: torch.Tensor


class OwnOutputs(torch.nn.Module):
    """Remote code's own output class (read by name, as the tasks read it), or one with nothing to compare."""

    def __init__(self, readable: bool) -> None:
        super().__init__()
        self.bert, self.readable = tiny_bert(), readable

    def forward(self, **inputs):
        hidden = self.bert(**inputs).last_hidden_state
        return Hidden(hidden) if self.readable else {"states": hidden}


@pytest.mark.parametrize("readable", [True, False])
def test_outputs_of_the_models_own_class(readable):
    model = OwnOutputs(readable)
    assert pack_cpu_linears(model, probe()) == (13 if readable else 0)


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


def load_classifier(path, max_rows: int = 16, max_length: int = 32) -> Classify:
    model = ModelSettings(path=str(path), adapter=None, task="classify", max_length=max_length, dtype="float32",
                          trust_remote_code=False, allow_pickle=False)
    settings = settings_for(model, batch=BatchSettings(max_tokens=256, max_rows=max_rows, sort_window=128))
    return Classify.load(LoadContext(settings, torch.device("cpu"), torch.float32))


def test_a_task_loaded_on_a_cpu_runs_on_packed_layers(models):
    task = load_classifier(models.classifier)
    assert sum(isinstance(m, PackedLinear) for m in task.model.modules()) == 14
    assert not any(type(m) is torch.nn.Linear for m in task.model.modules())


@pytest.mark.parametrize("max_rows,max_length", [(1, 32), (16, 4)])
def test_the_probe_batch_stays_within_the_batch_limits(models, monkeypatch, max_rows, max_length):
    probes = []
    monkeypatch.setattr(cpu_linear, "pack_cpu_linears", lambda model, probe: probes.append(probe) or 0)
    load_classifier(models.classifier, max_rows, max_length)
    (probe,) = probes
    rows, width = probe["input_ids"].shape
    assert rows == min(2, max_rows) and width <= max_length and probe["attention_mask"].shape == (rows, width)
