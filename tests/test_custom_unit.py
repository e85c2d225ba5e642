"""The custom task's checks of what the user's code returns, one call at a time (no workflow run)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.shard.device_loop import CopyBack, predict_splitting
from shardinfer.tasks.base import Window
from shardinfer.tasks.custom import Custom

ENTRYPOINT = "hook.py:build"


class Predictor:
    def __init__(self, outputs: dict, cost=None) -> None:
        self.outputs = outputs
        if cost is not None:
            self.cost = cost

    def predict(self, batch, index):
        raise AssertionError("not called here")


def context(keep=("id",)) -> SimpleNamespace:
    """The parts of a LoadContext the custom task reads."""
    settings = SimpleNamespace(model=SimpleNamespace(entrypoint=ENTRYPOINT), input=SimpleNamespace(keep_columns=keep))
    return SimpleNamespace(settings=settings)


def custom(outputs: dict, cost=None) -> Custom:
    return Custom(Predictor(outputs, cost), context())


def refused(call, message: str) -> str:
    with pytest.raises(UserError, match=message) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_matrix_for_a_list_column_is_one_list_per_row():
    task = custom({"vec": "list<float32>", "ids": "list<int64>"})
    matrix = np.arange(6, dtype=np.float32).reshape(3, 2)
    vec, ids = task.to_arrow({"vec": matrix, "ids": np.arange(6).reshape(3, 2)}, np.arange(3))
    assert vec.type == pa.list_(pa.float32()) and vec.to_pylist() == [[0, 1], [2, 3], [4, 5]]
    assert ids.to_pylist() == [[0, 1], [2, 3], [4, 5]]
    cube = task.typed("vec", "list<list<float32>>", np.zeros((2, 1, 2)), np.arange(2))
    assert cube.to_pylist() == [[[0, 0]], [[0, 0]]]


def test_a_fraction_for_an_integer_column_names_the_row_or_the_column():
    task = custom({"n": "int64"})
    refused(lambda: task.to_arrow({"n": np.array([1.0, 1.5])}, np.array([7, 8])),
            r"row 8: column `n` is declared int64 but got .*1\.5")
    refused(lambda: task.to_arrow({"n": [2.0, 1.5]}, np.array([7, 8])), r"row 8: .* got 1\.5 \(not a whole number\)")
    assert task.to_arrow({"n": [2.0, None, 3]}, np.arange(3))[0].to_pylist() == [2, None, 3]
    refused(lambda: task.typed("n", "list<int64>", [[1], "x"], np.array([3, 4])), r"row 4: column `n`")
    ragged = np.empty(2, dtype=object)
    ragged[:] = [[1], [2, 2.5]]
    for nested in ([[1], [2.0, 2.5]], [[1], np.array([2.0, 2.5])], np.array([[1.0], [2.5]]), ragged):  # in lists too
        refused(lambda nested=nested: task.typed("n", "list<int64>", nested, np.array([3, 4])),
                r"row 4: .* got 2\.5 \(not a whole")
    refused(lambda: task.typed("n", "list<list<int64>>", [[[1]], [[0.5]]], np.array([3, 4])), r"row 4: .* got 0\.5")
    assert task.typed("n", "list<int64>", [[1.0], np.array([2.0, 3.0])], np.array([3, 4])).to_pylist() == [[1], [2, 3]]


def test_a_float_beyond_a_narrower_floats_range_is_refused_not_stored_as_inf():
    task = custom({"x": "float32", "v": "list<float32>", "h": "float16"})
    refused(lambda: task.typed("x", "float32", [1.0, 1e300], np.array([7, 8])),
            r"row 8: column `x` is declared float32 but got 1e\+300 \(beyond float32's range; declare float64\)")
    refused(lambda: task.typed("x", "float32", np.array([1e300, 2.0]), np.array([7, 8])), r"row 7: column `x`")
    refused(lambda: task.typed("v", "list<float32>", np.array([[1.0, 2.0], [3.0, -1e39]]), np.array([4, 5])),
            r"row 5: column `v` is declared list<float32> but got -1e\+39")
    refused(lambda: task.typed("v", "list<float32>", [None, [1.0], [2.0, 5e38]], np.array([4, 5, 6])), r"row 6: ")
    refused(lambda: task.typed("h", "float16", [70000.0], np.array([3])), r"row 3: column `h` .* got 70000\.0")
    kept = task.typed("x", "float32", [float("inf"), float("nan"), None, 3e38], np.arange(4)).to_pylist()
    assert kept[0] == float("inf") and kept[1] != kept[1] and kept[2] is None  # an inf given is an inf kept


def test_values_that_fail_only_together_name_the_column_type_and_cause(monkeypatch):
    task = custom({"n": "int64"})
    real = pa.array

    def fails_whole(values, type=None):  # no single value fails, the column does
        if len(values) > 1:
            raise pa.ArrowInvalid("cannot mix them\nsecond line")
        return real(values, type=type)

    monkeypatch.setattr(pa, "array", fails_whole)
    message = refused(lambda: task.typed("n", "int64", [1, 2], np.arange(2)),
                      r"column `n` is declared int64 but its values do not convert to it: cannot mix them$")
    assert "ArrowInvalid" not in message


@pytest.mark.parametrize("values,kind", [(np.float32(1.0), "float32"), (np.array(2.0), "ndarray"),
                                         ("ab", "str"), (torch.tensor(1.0), "Tensor")])
def test_one_value_for_a_column_is_refused_even_of_the_right_length(values, kind):
    task = custom({"v": "string"})
    refused(lambda: task.checked({"v": values}, 2, "rows 0..1"), rf"column `v` is a {kind}, not one value per row")


def test_a_cost_that_fails_or_is_not_whole_is_refused_in_one_line(caplog):
    table = pa.table({"x": [1, 2]})
    assert custom({"v": "int64"}, cost=lambda t: [2.0, 3]).prepare(5, table).costs.tolist() == [2, 3]
    refused(lambda: custom({"v": "int64"}, cost=lambda t: [1.7, 1]).prepare(5, table),
            r"cost\(\) must give one whole number >= 1 per row for rows 5..6; got \[1.7, 1.0\]")

    def broken(t):
        raise KeyError("size")

    with caplog.at_level(logging.ERROR):
        refused(lambda: custom({"v": "int64"}, cost=broken).prepare(5, table), r"cost failed on rows 5..6: KeyError")
    assert "Traceback" in caplog.text


@pytest.mark.parametrize("name,message", [("a-b", "is not a name"), ("file/x", "is not a name"),
                                          ("1st", "is not a name"), ("id", "clashes with index, id"),
                                          ("index", "clashes with")])
def test_output_names_are_identifiers_apart_from_the_index_and_keep_columns(name, message):
    refused(lambda: custom({name: "int64"}), message)


def test_an_output_may_take_an_input_columns_name():
    assert custom({"text": "string"}).outputs == {"text": "string"}  # input columns are not written beside it


def test_a_bfloat16_output_comes_back_as_float32():
    back = CopyBack({"x": torch.tensor([1.5, 2.0], dtype=torch.bfloat16)}).ready()
    assert back["x"].dtype == np.float32 and back["x"].tolist() == [1.5, 2.0]


def test_a_custom_row_that_never_fits_does_not_name_max_length():
    class OutOfMemory(Custom):
        def predict(self, batch):
            raise torch.OutOfMemoryError("no room")

    task = OutOfMemory(Predictor({"v": "int64"}), context())
    window = Window(3, np.array([4]), pa.table({"x": [1]}))
    engine = Transformers(task)
    message = refused(lambda: list(predict_splitting(engine, window, np.array([0]), None, torch.device("cpu"))),
                      r"row 3 \(4 cost units\) does not fit in device memory even alone; lower what your code needs")
    assert "max_length" not in message


def test_a_file_below_a_custom_model_folder_enters_the_shard_digest(tmp_path):
    """A custom task's model.path is any folder of the user's: a weight file in a sub-folder reruns
    the shards when it changes; a Hugging Face task's flat folder is read one level deep."""
    from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings, Settings
    from shardinfer.snakefile.settings_digest import output_digest

    (tmp_path / "weights" / "stage2").mkdir(parents=True)
    weight = tmp_path / "weights" / "stage2" / "w.bin"
    weight.write_bytes(b"1")
    (tmp_path / "hook.py").write_text("def build(path, options, device):\n    pass\n")

    def digest(task: str) -> str:
        model = ModelSettings(path=str(tmp_path / "weights"), adapter=None, task=task, max_length=8,
                              dtype="float32", trust_remote_code=False, allow_pickle=False,
                              entrypoint=f"{tmp_path / 'hook.py'}:build" if task == "custom" else None)
        inp = InputSettings(path="in.csv", format="csv", text_column="text", keep_columns=(), null_text="error",
                            columns=("a",) if task == "custom" else ())
        return output_digest(Settings(inp, model, BatchSettings(64, 8, 64), 1))

    before = {task: digest(task) for task in ("custom", "embed")}
    weight.write_bytes(b"22")
    assert digest("custom") != before["custom"] and digest("embed") == before["embed"]
