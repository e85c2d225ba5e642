"""Hugging Face `datasets` folders, as `Dataset.save_to_disk` writes them: Arrow IPC stream files
(`data-00000-of-00004.arrow`, ...) listed in `state.json`, beside `dataset_info.json`.

The rows are the dataset's, in its order: the data files in the order `state.json` lists them
(save_to_disk writes a shuffled or selected dataset with its indices applied). The JSON files
are passed over. A `DatasetDict` folder (`dataset_dict.json`, a sub-folder per split) is never
read as one table, since concatenating its splits silently would mix train and test: name one
split with `input.hf_dataset.split` (or today's `input.split`), or run several as named inputs,
one per split (`inputs: {train: {path: data/ds, split: train}, test: {path: data/ds, split:
test}}`), each planned, sharded and proven on its own. Read with pyarrow alone: `datasets` need
not be installed (it writes the samples, `write`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.input.formats.arrow import Arrow
from shardinfer.input.formats.base import FormatOptions

STATE = "state.json"
SPLITS = "dataset_dict.json"


def _splits(folder: str) -> list[str]:
    return list(json.loads(Path(folder, SPLITS).read_text()).get("splits", []))


def _data_files(folder: str) -> tuple[str, ...]:
    """The data files that `state.json` lists, in its order; an indices mapping is refused."""
    state = json.loads(Path(folder, STATE).read_text())
    if state.get("_indices_data_files"):
        raise UserError(f"input.path `{folder}`: the dataset has an indices mapping; save it with "
                        "save_to_disk (which applies it) or call flatten_indices() first")
    files = tuple(os.path.join(folder, entry["filename"]) for entry in state.get("_data_files", []))
    if not files:
        raise UserError(f"input.path `{folder}`: its {STATE} lists no data files")
    return files


@dataclass(frozen=True)
class HfDatasetOptions(FormatOptions):
    """`input.hf_dataset`: the split of a DatasetDict folder to read (None: the folder is one dataset)."""
    split: str | None = None


class HfDataset(Arrow):
    """A `save_to_disk` folder, found by its `state.json`; its files are read as Arrow streams."""

    name = "hf_dataset"
    extensions = ()  # found by its folder, not by a file's name
    folder_markers = (STATE, SPLITS)
    options_type = HfDatasetOptions

    def folder_parts(self, folder: str, options: HfDatasetOptions) -> tuple[str, ...] | None:
        split = options.split
        if os.path.isfile(os.path.join(folder, SPLITS)):
            return self._split_parts(folder, split)
        if not os.path.isfile(os.path.join(folder, STATE)):
            return None
        if split is not None:
            raise UserError(f"input.split `{split}`: input.path `{folder}` is one dataset, not a DatasetDict "
                            "with splits; leave input.split out")
        return _data_files(folder)

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """A `save_to_disk` folder, a data file per `block_rows` rows, by `datasets` itself."""
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset(table).save_to_disk(path, num_shards=max(1, math.ceil(table.num_rows / block_rows)))

    def _split_parts(self, folder: str, split: str | None) -> tuple[str, ...]:
        splits = _splits(folder)
        ways = (f"set input.split to one of them, or run each as a named input (inputs: {{{splits[0]}: {{path: "
                f"{folder}, split: {splits[0]}}}, ...}})") if splits else "it lists none"
        if split is None or split not in splits:
            given = "" if split is None else f"input.split `{split}` is not one of them; "
            raise UserError(f"input.path `{folder}` is a DatasetDict with splits {', '.join(splits)}; {given}{ways}")
        return _data_files(os.path.join(folder, split))


FORMATS = (HfDataset(),)
