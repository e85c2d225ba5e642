"""Any PyTorch model: the user's own code, behind the same proof as the built-in tasks.

The contract (docs/tasks/custom.md), promised to users:

    build(model_path: str | None, options: dict, device: torch.device) -> predictor
    predictor.outputs: dict[str, str]       # column -> "float32", "int64", "string", "list<float32>",
                                            # ..., or "file:.png" (a file per row)
    predictor.predict(batch: pyarrow.Table, index: numpy.ndarray) -> dict[str, list]
    predictor.cost(batch: pyarrow.Table) -> list[int]   # optional: per-row cost for batching; default 1

`build` is named by `model.entrypoint` in the config, never by data, and called once per shard
job. `batch` holds the rows' `input.columns`; `index` their global row numbers (to seed per-row
randomness, so a row's output never depends on its batch or shard). For a file column the value
is the file's bytes, or None for no file: the runner writes the files (`shardinfer.shard.row_files`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardinfer.contract.shard_file import INDEX_COLUMN, arrow_type, file_suffix
from shardinfer.core.errors import RowError, UserError
from shardinfer.settings.config import Settings
from shardinfer.tasks.base import LoadContext, Task, TaskInputs, Window, matrix_to_list_array, tokenize_ahead_refused
from shardinfer.tasks.traits import PlanCost, Reporting

log = logging.getLogger(__name__)
OUTPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # may become part of file names
CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


def load_entrypoint(entrypoint: str) -> Callable:
    """The function `file.py:name` (a path relative to the working directory) or `module:name`."""
    source, _, name = entrypoint.rpartition(":")
    try:
        if source.endswith(".py"):
            module_name = f"shardinfer_hook_{hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:12]}"
            spec = importlib.util.spec_from_file_location(module_name, source)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses and pickling look their module up here
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except Exception as error:
        raise _hook_error(entrypoint, f"importing `{source}` failed", error) from error
    if not callable(getattr(module, name, None)):
        raise UserError(f"model.entrypoint `{entrypoint}`: `{source}` has no function `{name}`")
    return getattr(module, name)


def check_entrypoint(entrypoint: str | None) -> None:
    """`path/to/file.py:function` (relative to the working directory) or `module:function`: checked
    when the Snakefile loads, without importing it (`load_entrypoint` does, in the shard job)."""
    if not entrypoint:
        raise UserError("model.entrypoint is required for task custom: `hooks/file.py:build` or `module:build`")
    source, _, function = entrypoint.rpartition(":")
    if not source or not function.isidentifier():
        raise UserError(f"model.entrypoint `{entrypoint}` must be `file.py:function` or `module:function`")
    if source.endswith(".py"):
        if not Path(source).is_file():
            raise UserError(f"model.entrypoint `{entrypoint}`: file `{source}` does not exist "
                            "(paths are relative to the working directory)")
    elif importlib.util.find_spec(source.split(".")[0]) is None:
        raise UserError(f"model.entrypoint `{entrypoint}`: module `{source}` cannot be imported here")


def _hook_error(entrypoint: str, what: str, error: BaseException, kind: type = UserError) -> UserError:
    """The hook's own traceback into the shard log; one line for the terminal."""
    log.error("traceback of your code (model.entrypoint `%s`):\n%s", entrypoint,
              "".join(traceback.format_exception(error)).rstrip())
    return kind(f"model.entrypoint `{entrypoint}`: {what}: {type(error).__name__}: {error} "
                     "(traceback in this shard's log)")


def check_outputs(entrypoint: str, outputs: Any, reserved: tuple[str, ...]) -> dict[str, str]:
    """`outputs` maps names (letters, digits and `_`) to known type strings and names neither the
    index nor a keep column (`reserved`): those are written beside the outputs."""
    if not isinstance(outputs, dict) or not outputs:
        raise UserError(f"model.entrypoint `{entrypoint}`: the predictor's `outputs` must be a non-empty dict of "
                        f"column -> type, got {outputs!r}")
    for name, spec in outputs.items():
        if not isinstance(name, str) or not OUTPUT_NAME.fullmatch(name):
            raise UserError(f"model.entrypoint `{entrypoint}`: output column {name!r} is not a name of letters, "
                            "digits and _ (not starting with a digit)")
        if name in reserved:
            raise UserError(f"model.entrypoint `{entrypoint}`: output column `{name}` clashes with "
                            f"{', '.join(reserved)} (the index and keep columns)")
        try:
            arrow_type(str(spec))
        except ValueError as error:
            raise UserError(f"model.entrypoint `{entrypoint}`: output column `{name}`: {error}") from None
    return {name: str(spec) for name, spec in outputs.items()}


def describe_rows(index: np.ndarray) -> str:
    """`row 7`, `rows 4..9` (contiguous) or `rows 3, 8, 12, ...`: which rows a batch held."""
    if len(index) == 1:
        return f"row {int(index[0])}"
    if np.array_equal(index, np.arange(index[0], index[0] + len(index))):
        return f"rows {int(index[0])}..{int(index[-1])}"
    return f"rows {', '.join(map(str, index[:5].tolist()))}{', ...' if len(index) > 5 else ''}"


class RowsOf:
    """A batch's rows as `describe_rows` names them, worded only when a message needs them: a batch
    that succeeds (all but a few of a shard's tens of thousands) pays nothing for it."""

    def __init__(self, index: np.ndarray) -> None:
        self.index = index

    def __str__(self) -> str:
        return describe_rows(self.index)


class Custom(Task):
    name = "custom"
    columns_from_code = True  # known once the user's code is loaded (`columns`)
    writes_files = True  # its outputs may declare file columns
    cost = PlanCost(unit="cost units")  # what `predictor.cost` counts
    reporting = Reporting(counts_tokens=False)
    model_files_below = True

    @classmethod
    def inputs(cls, inp: dict, section: dict) -> TaskInputs:
        """`input.columns`, handed to the user's code as they are: none of them is measured as text."""
        columns = tuple(inp.get("columns") or ())
        return TaskInputs(columns, ("input.columns",) * len(columns), ())

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """The user's code is named by the config (never by data) and exists; it reads `input.columns`."""
        inp, model = settings.input, settings.model
        if not inp.columns:
            raise UserError("input.columns is required for task custom: the input columns handed to your code, "
                            "e.g. [img, cond]")
        if len(set(inp.columns)) != len(inp.columns):
            raise UserError(f"input.columns lists a column twice: {list(inp.columns)}")
        for key, value in (("model.adapter", model.adapter), ("model.labels", model.labels),
                           ("model.max_new_tokens", model.max_new_tokens)):
            if value is not None:
                raise UserError(f"{key} is for the Hugging Face tasks; task custom hands model.path and "
                                "model.options to your code, so leave it out")
        if settings.tokenize_ahead:
            raise tokenize_ahead_refused(cls.name, "has no tokenizer (set it to false)")
        if model.path is not None and not Path(model.path).exists():
            raise UserError(f"model.path `{model.path}` does not exist")
        check_entrypoint(model.entrypoint)

    def __init__(self, predictor: Any, context: LoadContext) -> None:
        self.predictor = predictor
        self.entrypoint = context.settings.model.entrypoint
        reserved = (INDEX_COLUMN, *context.settings.input.keep_columns)
        self.outputs = check_outputs(self.entrypoint, getattr(predictor, "outputs", None), reserved)
        if not callable(getattr(predictor, "predict", None)):
            raise UserError(f"model.entrypoint `{self.entrypoint}`: what it returned has no predict(batch, index)")

    @property
    def columns(self) -> dict[str, str]:
        """The columns the user's code declared (`outputs`)."""
        return self.outputs

    @classmethod
    def load(cls, context: LoadContext) -> Custom:
        model = context.settings.model
        build = load_entrypoint(model.entrypoint)
        try:
            predictor = build(model.path, dict(model.options), context.device)
        except Exception as error:
            raise _hook_error(model.entrypoint, "build failed", error) from error
        return cls(predictor, context)

    def prepare(self, first: int, table: pa.Table) -> Window:
        costs = np.ones(table.num_rows, dtype=np.int64)
        if callable(getattr(self.predictor, "cost", None)):
            costs = self.costs(first, table)
        return Window(first, costs, table)

    def costs(self, first: int, table: pa.Table) -> np.ndarray:
        """The hook's cost per row: whole numbers >= 1 (1.7 is refused, not cut to 1)."""
        rows = describe_rows(np.arange(first, first + table.num_rows))
        try:
            costs = np.asarray(self.predictor.cost(table))
        except Exception as error:
            raise _hook_error(self.entrypoint, f"cost failed on {rows}", error) from error
        whole = costs.dtype.kind in "iu" or (costs.dtype.kind == "f" and np.isfinite(costs).all()
                                             and (costs == np.round(costs)).all())
        if not whole or costs.shape != (table.num_rows,) or (costs < 1).any():
            raise UserError(f"model.entrypoint `{self.entrypoint}`: cost() must give one whole number >= 1 per row "
                            f"for {rows}; got {costs.tolist()!r:.80}")
        return costs.astype(np.int64)

    def collate(self, window: Window, positions: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The batch's rows and their row numbers. Rows in window order (equal costs: every hook without
        `cost`) are a slice of the window, not a copy by `take` (a third of a narrow shard's batching)."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (np.diff(positions) == 1).all():
            rows = window.data.slice(int(positions[0]), len(positions)).combine_chunks()
        else:
            rows = window.data.take(pa.array(positions))
        return rows, window.first + positions

    def predict(self, batch: tuple[pa.Table, np.ndarray]) -> dict[str, Any]:
        import torch

        table, index = batch
        rows = RowsOf(index)
        try:
            results = self.predictor.predict(table, index)
        except torch.OutOfMemoryError:
            raise  # the runner halves the batch
        except Exception as error:
            raise _hook_error(self.entrypoint, f"predict failed on {rows}", error, RowError) from error
        return self.checked(results, len(index), rows)

    def checked(self, results: Any, count: int, rows: str | RowsOf) -> dict[str, Any]:
        """One value per row for exactly the declared columns."""
        if not isinstance(results, dict):
            raise UserError(f"{self.predicted_on(rows)} returned {type(results).__name__}, "
                            "not a dict of column -> values")
        undeclared = sorted(set(results) - set(self.outputs))
        missing = [name for name in self.outputs if name not in results]
        if undeclared or missing:
            fault = "not declared in outputs" if undeclared else "missing"
            raise UserError(f"{self.predicted_on(rows)}: columns {undeclared or missing} are {fault} "
                            f"(outputs: {', '.join(self.outputs)})")
        for name, values in results.items():
            size = _value_count(values)
            if size is None:
                raise UserError(f"{self.predicted_on(rows)}: column `{name}` is a {type(values).__name__}, "
                                "not one value per row (a list, array or tensor)")
            if size != count:
                raise UserError(f"{self.predicted_on(rows)}: column `{name}` has {size} value(s) for {count} rows")
        return {name: results[name] for name in self.outputs}

    def predicted_on(self, rows: str | RowsOf) -> str:
        return f"model.entrypoint `{self.entrypoint}`: predict on {rows}"

    def to_arrow(self, results: dict, index: np.ndarray) -> list:
        """Each column in its declared type; a file column's bytes pass to the runner's file writer."""
        return [list(results[name]) if file_suffix(spec) else self.typed(name, spec, results[name], index)
                for name, spec in self.outputs.items()]

    def typed(self, name: str, spec: str, values: Any, index: np.ndarray) -> pa.Array:
        """The column in its declared type; a bad value is named with its row."""
        kind = arrow_type(spec)
        if isinstance(values, np.ndarray) and values.ndim > 1:  # a matrix: one list per row
            if kind == pa.list_(pa.float32()) and values.ndim == 2 and values.shape[1] and values.dtype.kind in "fiu":
                array = matrix_to_list_array(values)
                if values.dtype.itemsize > 4 and values.dtype.kind == "f":
                    self.refuse_overflow(name, spec, array, pa.array(list(values), pa.list_(pa.float64())), index)
                return array
            values = values.tolist()
        values = values if isinstance(values, np.ndarray) else list(values)
        inner = kind
        while pa.types.is_list(inner):
            inner = inner.value_type
        numeric = isinstance(values, np.ndarray) and values.dtype != object  # Arrow refuses fractions there
        if pa.types.is_integer(inner) and not numeric:
            self.refuse_fractions(name, spec, values, index)
        try:
            array = pa.array(values, type=kind)
            if _narrow_float(inner):
                self.refuse_overflow(name, spec, array, pa.array(values, type=_with_float64(kind)), index)
            return array
        except CONVERSION_ERRORS as error:
            for k, row in enumerate(index.tolist()):
                value = values[k: k + 1]  # an array's slice: numpy's own cast rules, as for the whole
                try:
                    pa.array(value, type=kind)
                except CONVERSION_ERRORS as cause:
                    raise UserError(f"model.entrypoint `{self.entrypoint}`: row {row}: column `{name}` is declared "
                                    f"{spec} but got {value[0]!r:.60} ({cause})") from None
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"model.entrypoint `{self.entrypoint}`: column `{name}` is declared {spec} but its values "
                            f"do not convert to it: {first_line:.200}") from error

    def refuse_overflow(self, name: str, spec: str, array: pa.Array, wide: pa.Array, index: np.ndarray) -> None:
        """Arrow (and numpy) turn a float beyond a narrower float's range into inf silently (1e300
        as float32); `wide`: the same values as float64."""
        rows = np.arange(len(array))
        while pa.types.is_list(array.type):
            rows = rows[pc.list_parent_indices(array).to_numpy()]
            array, wide = pc.list_flatten(array), pc.list_flatten(wide)
        grew = pc.and_(pc.is_inf(array), pc.invert(pc.is_inf(wide))).fill_null(False).to_numpy(zero_copy_only=False)
        if grew.any():
            first = int(np.flatnonzero(grew)[0])
            raise UserError(f"model.entrypoint `{self.entrypoint}`: row {int(index[rows[first]])}: column `{name}` is "
                            f"declared {spec} but got {wide[first].as_py()!r} (beyond {spec}'s range; declare float64)")

    def refuse_fractions(self, name: str, spec: str, values: list, index: np.ndarray) -> None:
        """Arrow turns a float into an integer silently (1.5 -> 1), in a list too; a whole array of
        floats it refuses."""
        for value, row in zip(values, index.tolist()):
            fraction = _first_fraction(value)
            if fraction is not None:
                raise UserError(f"model.entrypoint `{self.entrypoint}`: row {row}: column `{name}` is declared "
                                f"{spec} but got {fraction!r:.60} (not a whole number)")


def _narrow_float(kind: pa.DataType) -> bool:
    return pa.types.is_float16(kind) or pa.types.is_float32(kind)


def _with_float64(kind: pa.DataType) -> pa.DataType:
    """The type with float64 in place of its (nested) float values: what the user's values hold."""
    return pa.list_(_with_float64(kind.value_type)) if pa.types.is_list(kind) else pa.float64()


def _first_fraction(value: Any) -> Any:
    """The first float that is not a whole number in a value or (nested) list of them; None if none."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        bad = value[~np.equal(np.mod(value, 1), 0)] if value.dtype.kind == "f" else value[:0]
        return bad.flat[0].item() if bad.size else None
    if isinstance(value, (list, tuple, np.ndarray)):  # an array of objects: ragged lists
        return next((found for item in value if (found := _first_fraction(item)) is not None), None)
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        return float(value)
    return None


def _value_count(values: Any) -> int | None:
    """How many per-row values a column holds; None for a single value (a str is one value, not a list
    of characters; a 0-d array is one number)."""
    if isinstance(values, (str, bytes, dict)):
        return None
    try:
        return len(values)
    except TypeError:
        return None
