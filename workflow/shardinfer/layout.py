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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardinfer.config import Settings
from shardinfer.rule_params import InputJobs
from shardinfer.tasks import may_write_files, task_class

# Outputs that are folders (Snakemake's directory()): the plan's staged copies, a shard's files per row.
FOLDERS = ("staged", "files")


@dataclass(frozen=True)
class ReportItem:
    """An item of `snakemake --report` beside the run's fixed four (workflow/rules/report.smk), with
    its caption in workflow/report/, named as the item."""

    name: str
    path: str
    category: str
    subcategory: str
    label: str  # what the item shows: its `item` label

    @property
    def caption(self) -> str:
        """The caption's path as report() takes it, from a file of workflow/rules/."""
        return f"../report/{self.name}.rst"


# The items a run's settings may add, in the order the report lists them: with `evaluate:` its scores
# (and for a task scored against labels the confusion matrix), for a task whose rows are texts in
# tokens the text-length figure.
OPTIONAL_REPORTS = (
    ReportItem("metrics", "results/report/metrics.html", "Evaluation", "Scores", "scores against the gold labels"),
    ReportItem("confusion", "results/report/confusion.png", "Evaluation", "Scores", "confusion matrix"),
    ReportItem("token_lengths", "results/report/token_lengths.png", "Input", "Text lengths", "text lengths in tokens"),
)


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

    @classmethod
    def of(cls, inputs: Mapping[str | None, InputJobs], storage: bool, storage_prefix: str,
           tokenizer_key: str | None) -> Layout:
        """The layout of a run whose inputs share their model, task and evaluate settings."""
        settings: Settings = next(iter(inputs.values())).settings
        task = task_class(settings.model.task)
        scored = settings.evaluate.label_column is not None
        wanted = {"metrics": scored, "confusion": scored and task.scored_as == "labels",
                  "token_lengths": task.counts_tokens}
        return cls(inputs, storage, storage_prefix, may_write_files(settings.model.task), tokenizer_key,
                   tuple(item.name for item in OPTIONAL_REPORTS if wanted[item.name]))

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
    def shard_file(self) -> str:
        return self.path("results/shards/{shard}.parquet")

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
        """A shard's folder of files per row, when the task may write any (README, "Your own model")."""
        return self.path("results/files/{shard}")

    @property
    def tokens_file(self) -> str:
        return self.path(f"results/tokens/{self.tokenizer_key}/{{shard}}.parquet")

    @property
    def gathered(self) -> dict[str, str]:
        """The gather job's outputs: the final table and its summary."""
        return {"predictions": self.path("results/predictions.parquet"), "summary": self.path("results/summary.json")}

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
        shards = next(iter(self.inputs.values())).shards
        return {"cuts": [fill(self.cut_file, shard=shard) for shard in range(shards)]}

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

    def shard_files(self, wildcards: Mapping) -> list[str]:
        """Every planned shard file of the gather job's input, in shard order."""
        name = wildcards.get("name")
        return [fill(self.shard_file, shard=shard, name=name) for shard in range(self.shard_count(wildcards))]

    def files_folders(self, wildcards: Mapping) -> list[str]:
        """Every planned shard's files folder, when the task may write files; nothing otherwise."""
        if not self.files_per_row:
            return []
        name = wildcards.get("name")
        return [fill(self.files_dir, shard=shard, name=name) for shard in range(self.shard_count(wildcards))]

    def outdated(self, wildcards: Mapping) -> list[str]:
        """The gather outputs of the job's input, which a plan or shard job removes before its work: a
        run that fails after it never leaves the previous run's table as if it were current."""
        return [fill(path, name=wildcards.get("name")) for path in self.gathered.values()]

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

