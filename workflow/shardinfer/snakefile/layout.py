"""Where a run's files go, and what each rule reads and writes beyond its fixed files: one object,
built once when the Snakefile loads (workflow/rules/common.smk), that the rules call. It knows no
Snakemake: common.smk flags what Snakemake must know of (an output that is a folder, `FOLDERS`:
directory(); a model copy: ancient(); a report item: report()).

One input (`input:`): paths are as they always were (results/plan.json). Named inputs (`inputs:`):
the input's name after each path's first folder (results/val/plan.json, logs/val/infer/3.log), a
`{name}` wildcard by which each job's values are looked up (`input_value`).

Without a shared filesystem (a default storage provider: `storage`), every result is an object under
the storage prefix and each job sees only its declared files: the shards read their own rows, cut
by the plan (`shardinfer.input.shard_cuts`), instead of the input's parts and the plan's staged
copies, and gather proves the input's downloaded parts by their content.

The table (`output.layout`): one file written by gather, or a folder of parts whose manifest is
gather's output. On a shared filesystem gather links the shards' files into the folder; without
one each shard job writes its part straight into it (`results/predictions/part-00003-of-00008.parquet`,
so every `{shard}` of such a run is zero padded: name order is index order) with its record, which
gather proves it by without downloading it. Gather's outputs are its chosen writers' files
(`output.writers`: `shardinfer.output`) and the summary.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardinfer.core.jobs import Untracked
from shardinfer.input.image_files import gather_image_trigger, image_trigger
from shardinfer.input.images import input_folder
from shardinfer.output import TABLE, chosen_writers, default_writers, stale_paths, writer_files, writer_named
from shardinfer.output.base import part_name, part_width
from shardinfer.settings.config import Settings
from shardinfer.snakefile.report_items import OPTIONAL_REPORTS, ReportItem
from shardinfer.snakefile.rule_params import InputJobs
from shardinfer.tasks import may_write_files, task_class

# Outputs that are folders (Snakemake's directory()): the plan's staged copies, a shard's files per row.
FOLDERS = ("staged", "files")


def fill(pattern: str, **values) -> str:
    """`pattern` with each `{key}` of `values` filled in; those not given (None) stay wildcards."""
    for key, value in values.items():
        if value is not None:
            pattern = pattern.replace(f"{{{key}}}", str(value))
    return pattern


@dataclass(frozen=True)
class Layout:
    """The run's paths and each rule's run-dependent inputs and outputs. `inputs`: what the jobs of
    each input take (`{None: ...}` for the one `input`), in the config's order; `storage_prefix`:
    where results lie in storage ("" on a shared filesystem); `tokenizer_key`: the token files'
    folder when tokenizing ahead (None: not); `reports`: the names of the OPTIONAL_REPORTS made."""

    inputs: Mapping[str | None, InputJobs]
    storage: bool = False
    storage_prefix: str = ""
    files_per_row: bool = False  # the task may write a file per row (custom): a folder per shard
    tokenizer_key: str | None = None
    reports: tuple[str, ...] = ()
    parts: bool = False  # output.layout: parts (a folder of parts and its manifest)
    scored: bool = False  # evaluate: scores the table in gather
    writers: tuple[str, ...] = (TABLE,)  # what gather writes (output.writers: shardinfer.output), in order

    @classmethod
    def of(cls, inputs: Mapping[str | None, InputJobs], storage: bool, storage_prefix: str,
           tokenizer_key: str | None) -> Layout:
        """The layout of a run whose inputs share their model, task and evaluate settings."""
        settings: Settings = next(iter(inputs.values())).settings
        reporting = task_class(settings.model.task).reporting
        scored = settings.evaluate.label_column is not None
        wanted = {"metrics": scored, "confusion": scored and reporting.scored_as == "labels",
                  "token_lengths": reporting.counts_tokens}
        writers = tuple(writer.name for writer in chosen_writers(settings.output, settings.input, storage))
        return cls(inputs, storage, storage_prefix, may_write_files(settings.model.task), tokenizer_key,
                   tuple(item.name for item in OPTIONAL_REPORTS if wanted[item.name]), settings.output.parts, scored,
                   writers)

    @property
    def named(self) -> bool:
        return None not in self.inputs

    def path(self, pattern: str) -> str:
        """A path of one input: `pattern` itself for the one `input`; for named inputs, with the
        input's name after its first folder (results/{name}/plan.json)."""
        if not self.named:
            return pattern
        top, _, rest = pattern.partition("/")
        return f"{top}/{{name}}/{rest}"

    @property
    def stored_parts(self) -> bool:
        """Without a shared filesystem, in the parts layout: each shard job writes its part into the folder."""
        return self.storage and self.parts

    @property
    def shard_file(self) -> str:
        if self.stored_parts:  # one shard count for every input in a bucket (checks.check_storage_inputs)
            return f"{self.table}{part_name('{shard}', self.first_count)}"
        return self.path("results/shards/{shard}.parquet")

    @property
    def first_count(self) -> int:
        return next(iter(self.inputs.values())).shards

    @property
    def label_width(self) -> int:
        """The digits of a `{shard}` value: as the part names have them where parts are shard files."""
        return part_width(self.first_count) if self.stored_parts else 0

    def label(self, shard: int) -> str:
        """A shard's `{shard}` value: its number (zero padded where the shard files are parts)."""
        return f"{shard:0{self.label_width}d}"

    @property
    def record_file(self) -> str:
        """A shard job's record of what it wrote (`shardinfer.contract.pieces`): beside its shard file on
        a shared filesystem (not an output: a finished shard of an earlier version lacks it); without
        one an output of its own, which gather downloads instead of the part."""
        return self.path("results/shards/.{shard}.record.json")

    @property
    def staged_dir(self) -> str:
        """The plan's copies of the parts that shards cannot read by range (input.stage; often none)."""
        return self.path("results/staged")

    @property
    def cut_file(self) -> str:
        """A shard's own rows, cut by the plan, without a shared filesystem."""
        return self.path("results/cuts/{shard}.parquet")

    @property
    def files_dir(self) -> str:
        """A shard's folder of files per row, when the task may write any (docs/tasks/custom.md)."""
        return self.path("results/files/{shard}")

    @property
    def tokens_file(self) -> str:
        return self.path(f"results/tokens/{self.tokenizer_key}/{{shard}}.parquet")

    @property
    def table(self) -> str:
        """The proven Parquet table as a user reads it: the file, or the folder of parts (ending in `/`)."""
        return self.path(f"results/{writer_named(TABLE).shown(self.parts)}")

    @property
    def written(self) -> str:
        """What the terminal says the rows were written to: the first writer's file (or folder)."""
        return self.path(f"results/{writer_named(self.writers[0]).shown(self.parts)}")

    @property
    def gathered(self) -> dict[str, str]:
        """The gather job's outputs: each writer's files (of the Parquet parts, the folder's manifest)
        and the summary."""
        files = writer_files([writer_named(name) for name in self.writers], self.parts, self.path("results/"))
        return {**files, "summary": self.path("results/summary.json")}

    @property
    def folders(self) -> tuple[str, ...]:
        """Every rule output that is a folder (Snakemake's directory()): FOLDERS, and a writer's folder
        of parts (JSON Lines')."""
        return (*FOLDERS, *(key for name in self.writers
                            for key, path in writer_named(name).files(self.parts).items() if path.endswith("/")))

    @property
    def shard_dir(self) -> str:
        return os.path.dirname(self.shard_file)

    @property
    def files_root(self) -> str:
        return os.path.dirname(self.files_dir)

    @property
    def shard_reads(self) -> dict[str, str]:
        """What the shard (and tokenize) jobs read beside the plan: on a shared filesystem the plan's
        staged copies (the input's parts the plan stands for), a folder; without one the shard's cut."""
        return {"cut": self.cut_file} if self.storage else {"staged": self.staged_dir}

    @property
    def plan_outputs(self) -> dict[str, str | list[str]]:
        """What the plan writes beside the plan file: the staged copies' folder, or without a shared
        filesystem each shard's cut (one shard count for every input: checks.check_storage_inputs)."""
        if not self.storage:
            return {"staged": self.staged_dir}
        return {"cuts": [fill(self.cut_file, shard=self.label(shard)) for shard in range(self.first_count)]}

    @property
    def gather_reads(self) -> dict[str, Any]:
        """What gather proves the input by, its content digest: the staged copies, or without a shared
        filesystem the input's parts, downloaded."""
        return {"parts": self.input_value("files")} if self.storage else {"staged": self.staged_dir}

    @property
    def gather_part_names(self) -> Any:
        """Without a shared filesystem the parts' names as the bucket's listing found them (gather's
        `parts` are their local copies), which must be the planned ones; none otherwise."""
        return self.input_value("files") if self.storage else []

    @property
    def shard_outputs(self) -> dict[str, str]:
        """The infer job's outputs: its shard file (a part in the bucket, with its record as an
        output too, without a shared filesystem in the parts layout) and its files folder."""
        record = {"record": self.record_file} if self.stored_parts else {}
        return {**self.files_output, "shard": self.shard_file, **record}

    @property
    def infer_params(self) -> dict[str, bool]:
        """What an infer job is told beyond its settings: that its shard is one part in the bucket,
        never cut into pieces (they could not be uploaded: only declared outputs are)."""
        return {"one_part": True} if self.stored_parts else {}

    @property
    def image_params(self) -> dict[str, Any]:
        """The infer job's rerun trigger for the image files its rows name (`image_files.image_trigger`)."""
        return self._image_trigger("images", lambda plan, wildcards, folder: image_trigger(
            plan, int(wildcards.shard), folder))

    @property
    def gather_image_params(self) -> dict[str, Any]:
        """Gather's rerun trigger for every image file (`image_files.gather_image_trigger`)."""
        return self._image_trigger("image_identity", lambda plan, wildcards, folder: gather_image_trigger(
            plan, folder))

    def _image_trigger(self, name: str, trigger: Callable) -> dict[str, Any]:
        """{name: a param function of the job's wildcards}, on a shared filesystem with input.image_column;
        none otherwise (no other config's params change)."""
        if self.storage or not any(jobs.settings.input.image_columns for jobs in self.inputs.values()):
            return {}

        def param(wildcards) -> str:
            folder = input_folder(self.inputs[wildcards.get("name")].settings.input.path)
            return trigger(fill(self.path("results/plan.json"), name=wildcards.get("name")), wildcards, folder)

        return {name: param}

    @property
    def gather_shards(self) -> dict[str, Any]:
        """What gather reads of the shards: their files (and files folders); without a shared
        filesystem in the parts layout their records instead, and the parts only to score them."""
        if not self.stored_parts:
            return {"shards": self.shard_files, "files": self.files_folders}
        return {"records": self.record_files, **({"copies": self.shard_files} if self.scored else {})}

    @property
    def gather_params(self) -> dict[str, Any]:
        """Without a shared filesystem in the parts layout, the parts' names in the bucket (as gather
        names them in the manifest); where output.writers gives others than an input's defaults, the
        writers, a rerun trigger: switching one off reruns gather, which removes its files (no param
        for today's configs)."""
        stored = {"stored_parts": self.shard_files} if self.stored_parts else {}
        given = any(list(self.writers) != default_writers(jobs.settings.input.format) for jobs in self.inputs.values())
        return {**stored, **({"writers": list(self.writers)} if given else {})}

    @property
    def files_output(self) -> dict[str, str]:
        """The infer job's files folder beside its table, when the task may write files per row."""
        return {"files": self.files_dir} if self.files_per_row else {}

    @property
    def tokens_input(self) -> dict[str, str]:
        """The infer job's token file when tokenizing ahead: a pattern, not an input function, which
        Snakemake would call (and inspect) once per shard job."""
        return {"tokens": self.tokens_file} if self.tokenizer_key else {}

    def input_value(self, field: str) -> Any:
        """A param or input of one input's jobs, an `InputJobs` field: the value itself for the one
        `input`, which Snakemake takes once for all jobs; for named inputs, a function of the job's
        `{name}` wildcard."""
        if not self.named:
            return getattr(self.inputs[None], field)

        def of_named_input(wildcards) -> Any:
            return getattr(self.inputs[wildcards.name], field)

        return of_named_input

    def shard_count(self, wildcards: Mapping) -> int:
        """The planned shards of the job's input."""
        return self.inputs[wildcards.get("name")].shards

    def every_shard(self, pattern: str, wildcards: Mapping) -> list[str]:
        """`pattern` for every planned shard of the job's input, in shard order."""
        name = wildcards.get("name")
        return [fill(pattern, shard=self.label(shard), name=name) for shard in range(self.shard_count(wildcards))]

    def shard_files(self, wildcards: Mapping) -> list[str]:
        """Every planned shard file of the gather job's input, in shard order."""
        return self.every_shard(self.shard_file, wildcards)

    def record_files(self, wildcards: Mapping) -> list[str]:
        """Every planned shard's record, in shard order."""
        return self.every_shard(self.record_file, wildcards)

    def files_folders(self, wildcards: Mapping) -> list[str]:
        """Every planned shard's files folder, when the task may write files; nothing otherwise."""
        return self.every_shard(self.files_dir, wildcards) if self.files_per_row else []

    def outdated(self, wildcards: Mapping) -> list[str]:
        """The gather outputs of the job's input, which a plan or shard job removes before its work: a
        run that fails after it never leaves the previous run's table as if it were current. Of the
        parts layout, on a shared filesystem the whole folder; without one its manifest (the parts
        are the shard jobs' own: `stale_parts`). A param of plan and infer, whose value must not move
        with `output.writers` (OUTPUT_NEUTRAL): the table, the summary and the first file of each other
        writer the input gets by default, in this order; the rest is `also_outdated`."""
        name = wildcards.get("name")
        table = [self.table] if self.parts and not self.storage else []
        firsts = [self.path(f"results/{next(iter(writer_named(writer).files(self.parts).values()))}")
                  for writer in default_writers(self.inputs[name].settings.input.format)]
        return [fill(path, name=name) for path in [*table, firsts[0], self.path("results/summary.json"), *firsts[1:]]]

    def also_outdated(self, wildcards: Mapping) -> Untracked:
        """This run's gather outputs beside `outdated` (a writer's second file, the files of writers
        output.writers adds), which a plan or shard job removes too: a param Snakemake does not compare
        (`Untracked`), so that switching a writer on reruns no finished plan or shard."""
        name, outdated = wildcards.get("name"), self.outdated(wildcards)
        return Untracked([path for path in (fill(p, name=name).rstrip("/") for p in self.gathered.values())
                          if path not in outdated])

    def stale(self, wildcards: Mapping) -> list[str]:
        """What an earlier run's writers left that this run's do not write (`output.stale_paths`)."""
        stale = stale_paths([writer_named(name) for name in self.writers], self.parts, self.path("results/"))
        return [fill(path, name=wildcards.get("name")) for path in stale]

    def every_input(self, patterns: list[str]) -> list[str]:
        """The paths of `patterns` for every input, in the config's order."""
        if not self.named:
            return list(patterns)
        return [fill(pattern, name=name) for pattern in patterns for name in self.inputs]

    def stored_at(self, path: str) -> str:
        """Where a result lies: `path` itself, or without a shared filesystem its object in storage
        (the storage prefix before it, as Snakemake maps every input and output)."""
        return f"{self.storage_prefix}/{path}" if self.storage_prefix else path

    def unstored(self, query: str) -> str:
        """A result's path from its object's name in storage: `stored_at` undone."""
        return query.removeprefix(f"{self.storage_prefix}/")

    @property
    def report_items(self) -> list[ReportItem]:
        """The OPTIONAL_REPORTS this run makes, each at its input's path."""
        return [ReportItem(item.name, self.path(item.path), item.category, item.subcategory, item.label)
                for item in OPTIONAL_REPORTS if item.name in self.reports]

    def report_labels(self, item: str) -> dict[str, str]:
        """A report item's labels; for named inputs, the input's name first (an item per input)."""
        return {"input": "{name}", "item": item} if self.named else {"item": item}

