"""The items of `snakemake --report` that a run's settings may add beside its fixed four
(workflow/rules/report.smk): which there are, in the report's order, and where each lies. The
layout (`shardinfer.snakefile.layout`) says which a run makes, at its input's paths."""

from __future__ import annotations

from dataclasses import dataclass


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
