"""`evaluate:`: the proven table scored against the gold values the input kept, for summary.json.

Gather calls it after the proof, on the table it wrote, so the scores are those of exactly the rows
a user gets. The gold column travels as a keep column (config/README.md, `evaluate.label_column`):
nothing about it enters the shard digest, so switching `evaluate` reruns gather, never a shard.
Every number comes from scikit-learn, imported inside the functions that score: gather without an
evaluate section never imports it. A gold value that cannot be scored (null, or a label the model
does not know) is counted and named in the result, and the terminal warns of it: never dropped
silently. How a task is scored is its `Reporting.scored_as`; this module names no task. `headline` says
the scores a user looks for first, in gather's log and on the terminal (`shardinfer.report.terminal`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.core.errors import UserError
from shardinfer.hf.labels import label_names
from shardinfer.tasks import task_class

UNKNOWN_SHOWN = 10  # the most frequent unknown gold labels named in the summary
PUNCTUATION = str.maketrans("", "", string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def gold_kind(column: str, kind: pa.DataType, scored_as: str) -> str:
    """How the gold column is compared, by its type: `ids` (integers, or floats as pandas writes an
    int column with nulls) and `names` (strings) for labels, `texts` for texts, each with the task's
    column for that kind (`Reporting.compared`). Refuses any other type in one line, before gather writes
    anything."""
    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    if scored_as == "texts" and text:
        return "texts"
    if scored_as == "labels" and text:
        return "names"
    if scored_as == "labels" and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return "ids"
    wanted = "strings" if scored_as == "texts" else "integers (label ids) or strings (label names)"
    raise UserError(f"evaluate.label_column `{column}` holds {kind}; it must hold {wanted}")


def check_gold(schema: pa.Schema | None, task: str, column: str) -> None:
    """Gather's check before it writes: the shards carry the gold column, in a type it can score."""
    if schema is None:  # no rows at all: nothing to score
        return
    if column not in schema.names:
        raise UserError(f"evaluate.label_column `{column}` is not a column of the shard files; add it to "
                        "input.keep_columns (which reruns the shards)")
    gold_kind(column, schema.field(column).type, task_class(task).reporting.scored_as)


def score_predictions(path: str | list[str], model: dict, column: str) -> dict:
    """summary.json's `metrics`: the table at `path` (or the parts at each path, in order) scored
    against `column` as its task says."""
    task = task_class(model["task"]).reporting
    paths = [path] if isinstance(path, str) else path
    kind = gold_kind(column, pq.read_schema(paths[0]).field(column).type, task.scored_as)
    compared = task.compared[kind]
    columns = list(dict.fromkeys([column, compared]))
    table = pa.concat_tables([pq.read_table(part, columns=columns) for part in paths])
    metrics = SCORERS[task.scored_as](table, column, kind, compared, model)
    return {"task": model["task"], "label_column": column, "rows": table.num_rows, **metrics}


def headline(metrics: dict) -> str:
    """The scores a user looks for first (`evaluate:`): accuracy and macro F1, or exact match."""
    if metrics["scored"] == 0:
        return f"nothing scored: no row of `{metrics['label_column']}` holds a gold value the model knows"
    against = f"over {metrics['scored']:,} rows scored against `{metrics['label_column']}`"
    if "exact_match" in metrics:
        return (f"exact match {metrics['exact_match']:.4f} (normalized {metrics['normalized_exact_match']:.4f}) "
                f"{against}")
    return (f"accuracy {metrics['accuracy']:.4f}, macro F1 {metrics['macro_f1']:.4f} {against} "
            f"({metrics['compared_with']})")


def gold_values(gold: pa.ChunkedArray, kind: str) -> list:
    """The gold column as Python values, NaN as None; ids as ints where a float is integral (a
    non-integral one stays a float: a label no model knows)."""
    values = [None if isinstance(v, float) and v != v else v for v in gold.to_pylist()]
    if kind == "ids":
        return [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]
    return values


def split_gold(values: list, known: set | None) -> tuple[np.ndarray, int, Counter]:
    """Which rows are scored (a mask), how many gold values are null, and the unknown ones by count
    (`known` None: any non-null value is scored)."""
    nulls = sum(v is None for v in values)
    unknown = Counter(v for v in values if v is not None and known is not None and v not in known)
    scored = np.array([v is not None and (known is None or v in known) for v in values], dtype=bool)
    return scored, nulls, unknown


def unscored(nulls: int, unknown: Counter) -> dict:
    """What was not scored, for the summary and the terminal's warning."""
    shown = [{"value": value, "rows": rows} for value, rows in unknown.most_common(UNKNOWN_SHOWN)]
    return {"null": nulls, "unknown": sum(unknown.values()), "unknown_labels": shown}


def score_labels(table: pa.Table, column: str, kind: str, compared: str, model: dict) -> dict:
    """Classes: integer gold against the predicted ids, string gold against the predicted names (the
    column `compared`); the model's own labels (model.labels, the adapter's head, its config:
    shardinfer.hf.labels) say which are known."""
    names = label_names(model["path"], model.get("adapter"), model.get("labels"))
    known = range(len(names)) if kind == "ids" else names
    values = gold_values(table.column(column), kind)
    scored, nulls, unknown = split_gold(values, set(known))
    gold = np.array(values, dtype=object)[scored]
    predicted = np.array(table.column(compared).to_pylist(), dtype=object)[scored]
    if kind == "ids":
        gold, predicted = gold.astype(np.int64), predicted.astype(np.int64)
    present = set(gold.tolist()) | set(predicted.tolist())
    classes = [c for c in known if c in present]  # in the model's order
    shown = [names[c] for c in classes] if kind == "ids" else classes
    return {"compared_with": compared, "scored": int(scored.sum()), **unscored(nulls, unknown),
            **classification_scores(gold, predicted, classes, shown)}


def classification_scores(gold: np.ndarray, predicted: np.ndarray, classes: list, shown: list[str]) -> dict:
    """Accuracy, macro and weighted precision, recall and F1, per class the same and the support,
    and the confusion matrix (rows gold, columns predicted), over `classes`: those in the gold or the
    predictions, as scikit-learn takes them by default (a class in neither has no score to average)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    if not len(gold):
        return {"accuracy": None, "macro_f1": None, "weighted_f1": None, "per_class": [],
                "confusion": {"labels": [], "matrix": []}}
    averages = {}
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(gold, predicted, labels=classes, average=average, zero_division=0)
        averages.update({f"{average}_precision": float(p), f"{average}_recall": float(r), f"{average}_f1": float(f)})
    p, r, f, support = precision_recall_fscore_support(gold, predicted, labels=classes, zero_division=0)
    per_class = [{"label": name, "precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]),
                  "support": int(support[i])} for i, name in enumerate(shown)]
    matrix = confusion_matrix(gold, predicted, labels=classes)
    return {"accuracy": float(accuracy_score(gold, predicted)), **averages, "per_class": per_class,
            "confusion": {"labels": shown, "matrix": matrix.tolist()}}


def normalize_answer(text: str) -> str:
    """SQuAD's normalization (its evaluation script's normalize_answer): lower case, punctuation
    and the articles a/an/the removed, white space collapsed; "The Cat." equals "cat"."""
    return " ".join(ARTICLES.sub(" ", text.lower().translate(PUNCTUATION)).split())


def score_texts(table: pa.Table, column: str, kind: str, compared: str, model: dict) -> dict:
    """Reference texts against the generated ones (`compared`): exact match, and exact match after
    normalize_answer."""
    values = gold_values(table.column(column), kind)
    scored, nulls, unknown = split_gold(values, None)
    reference = [v for v, keep in zip(values, scored) if keep]
    generated = [g for g, keep in zip(table.column(compared).to_pylist(), scored) if keep]
    return {"compared_with": compared, "scored": len(reference), **unscored(nulls, unknown),
            **exact_match_scores(reference, generated)}


def exact_match_scores(reference: list[str], generated: list[str]) -> dict:
    """The share of rows whose text equals the reference, as is and normalized (scikit-learn's
    accuracy over the strings: exact match is accuracy with each distinct text a class)."""
    from sklearn.metrics import accuracy_score

    if not reference:
        return {"exact_match": None, "normalized_exact_match": None}
    exact = accuracy_score(np.array(reference, dtype=object), np.array(generated, dtype=object))
    normalized = accuracy_score(np.array([normalize_answer(t) for t in reference], dtype=object),
                                np.array([normalize_answer(t) for t in generated], dtype=object))
    return {"exact_match": float(exact), "normalized_exact_match": float(normalized)}


# Reporting.scored_as -> its scorer: (the table, the gold column, its gold_kind, the task's column it is
# compared with, the model settings) -> scores.
SCORERS: dict[str, Callable[[pa.Table, str, str, str, dict], dict]] = {"labels": score_labels,
                                                                       "texts": score_texts}
