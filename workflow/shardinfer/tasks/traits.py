"""What the run reads of a task without running it: its rows' cost and how its results are reported.

Each is a small frozen object the task holds as a class attribute: `Task.cost`, a `PlanCost` (what
the plan balances shards by, and the unit the device loop's messages count in), and
`Task.reporting`, a `Reporting` (what the summary, the terminal, the report and `evaluate:` make of
its results). Torch-free, like everything a task declares: the Snakefile, the plan and gather read
them without loading a model.

A task that keeps the defaults (a text task's rows in tokens, nothing to score) names neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shardinfer.settings.config import Settings


@dataclass(frozen=True)
class PlanCost:
    """A row's cost as the plan balances the shards by it: its estimated tokens (or, for custom, the
    unit its code counts in), plus what each row adds in a batch and what its images add. A task
    whose cost follows its settings subclasses this and overrides the two methods (generate)."""

    # What a row's cost counts, named in the device loop's messages ("cost units": custom's own).
    unit: str = "tokens"

    def overhead(self, settings: Settings) -> int:
        """Cost a row adds in a batch beyond its estimated tokens, which the plan's balance counts too
        (the plan rule's `overhead` param)."""
        return 0

    def image_params(self, settings: Settings) -> dict:
        """The plan rule's params for the images a row holds (input.image_column): {"image_cost": tokens
        per image}, which the plan's balance adds to a row's cost; none for a task that reads no images
        (so that no other config's plan params change)."""
        return {}


@dataclass(frozen=True)
class Reporting:
    """How a task's results are reported and scored, by gather's summary, the terminal, the report's
    items and `evaluate:` (none of which names a task)."""

    # Whether its rows are texts measured in tokens, so that the stats' real and padded tokens, the
    # truncation at max_length and the token-length histogram describe them (the report's text-length
    # figure, tokens/s and padding ratio); False (custom): costs in `PlanCost.unit`, none of those shown.
    counts_tokens: bool = True
    # Its running totals among `Task.finish()`'s stats (ints, summed over a resumed shard's jobs), each
    # reported per second over the run's wall time, by what the terminal calls that rate.
    totals: Mapping[str, str] = field(default_factory=dict)
    # How `evaluate:` scores its outputs against a gold column (shardinfer.scores.metrics.SCORERS):
    # "labels" (classes), "texts" (exact match); None: no metric, evaluate refused.
    scored_as: str | None = None
    # The output column `evaluate:` compares the gold values with, by their kind
    # (shardinfer.scores.metrics.gold_kind): "ids" and "names" for labels, "texts" for texts.
    compared: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.scored_as) != bool(self.compared):
            raise ValueError(f"a task scored as {self.scored_as!r} names the columns it compares ({self.compared}), "
                             "and only such a task")
