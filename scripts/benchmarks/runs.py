"""`--task generate`'s report: each variant's outcome (`Run`), its rates and the positions it
computed per real one, the engines' fixed costs against their generating rates, and the rows on
which the variants agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from benchmarks.child import generating


def computed_positions(prompts: np.ndarray, generated: np.ndarray, batches: list[np.ndarray]) -> int:
    """Positions a batched generate runs through the model: per batch, its rows x (its longest
    prompt + the steps until its last row is done), padding and finished rows included."""
    return sum(len(b) * int(prompts[b].max() + generated[b].max()) for b in batches)


@dataclass
class Run:
    """One variant's outcome; `seconds` includes loading the model, as the shard job's does."""

    name: str
    seconds: list[float]  # each repeat's; rates use the fastest
    texts: list[str]
    generated: np.ndarray  # tokens generated per row, the ending eos included
    prompts: np.ndarray  # prompt tokens per row
    batches: list[np.ndarray]  # the row numbers of each generate call

    def line(self) -> str:
        """rows, rows/s, generated tokens/s, and positions computed per real position (prompt + generated)."""
        rows, tokens, best = len(self.texts), int(self.generated.sum()), min(self.seconds)
        computed = computed_positions(self.prompts, self.generated, self.batches)
        runs = "/".join(f"{t:.1f}" for t in self.seconds)
        return (f"{self.name:42}{rows:>6}{rows / best:>9.2f}{tokens / best:>11.0f}"
                f"{computed / (self.prompts.sum() + tokens):>10.2f}   {runs}")


def baseline_run(name: str, ids: list[list[int]], seconds: list[float], tokenizer, prompts: np.ndarray,
                 size: int) -> Run:
    """A baseline's Run: its ids decoded as the shard job decodes them, its batches `size` rows in input order."""
    generated = np.asarray([len(row) for row in ids], dtype=np.int64)
    batches = [np.arange(a, min(a + size, len(ids))) for a in range(0, len(ids), size)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return Run(name, seconds, texts, generated, prompts[: len(ids)], batches)


def length_summary(generated: np.ndarray, finish: pd.Series, max_new: int) -> str:
    """The generated lengths: percentiles, a histogram in eighths of max_new_tokens, finish reasons."""
    q = np.percentile(generated, [0, 10, 25, 50, 75, 90, 100]).astype(int)
    edges = np.linspace(0, max_new, 9).astype(int)
    counts = np.histogram(generated, bins=edges + 0.5)[0] if max_new >= 8 else []
    bins = "  ".join(f"{a + 1}-{b}:{c}" for a, b, c in zip(edges[:-1], edges[1:], counts))
    reasons = ", ".join(f"{k} {v}" for k, v in finish.value_counts().items())
    return (f"generated tokens per row: min {q[0]}, p10 {q[1]}, p25 {q[2]}, median {q[3]}, p75 {q[4]}, p90 {q[5]}, "
            f"max {q[6]} (mean {generated.mean():.1f}); finish: {reasons}\n  histogram: {bins}")


def differing(reference: Run, other: Run) -> list[int]:
    """Rows whose generated text or token count differs from the reference's (over the reference's rows)."""
    return [i for i in range(len(reference.texts))
            if (reference.texts[i], reference.generated[i]) != (other.texts[i], other.generated[i])]


def print_generate(runs: list[Run]) -> None:
    """rows/s, generated tokens/s and computed/real positions per variant; ratios; agreement with the naive loop."""
    print(f"{'':42}{'rows':>6}{'rows/s':>9}{'gen tok/s':>11}{'computed':>10}   seconds per run (rates: fastest)")
    for run in runs:
        print(run.line())
    speed = [len(run.texts) / min(run.seconds) for run in runs]
    tokens = [run.generated.sum() / min(run.seconds) for run in runs]
    print(f"ours/naive: {speed[2] / speed[0]:.1f}x rows/s, {tokens[2] / tokens[0]:.1f}x gen tok/s; "
          f"ours/fixed8: {speed[2] / speed[1]:.1f}x rows/s, {tokens[2] / tokens[1]:.1f}x gen tok/s")
    for run, reference in ((runs[1], runs[0]), (runs[2], runs[0]), (runs[2], runs[1])):
        bad = differing(reference, run)
        print(f"{run.name}: {len(bad)} of {len(reference.texts)} rows differ from {reference.name.split(' (')[0]}"
              + (f" (first: {bad[:5]})" if bad else " (identical texts and token counts)"))
    print("computed: positions run through the model (each batch's rows x (longest prompt + steps until its last "
          "row is done)) per real position (prompt + generated tokens)")


def engine_runs(vllm: dict, bare: dict, seconds: dict, tokenizer, prompts: np.ndarray) -> tuple[Run, Run]:
    """The vLLM shard job's and the bare engine's Runs (one row per batch: nothing is padded)."""
    frame = vllm["frame"]
    singles = [np.array([i]) for i in range(len(frame))]
    shard = Run("shard job, vLLM engine", seconds["vllm"], frame["generated"].tolist(),
                frame["n_generated_tokens"].to_numpy(np.int64), prompts, singles)
    plain = baseline_run("bare LLM.generate (same token ids)", bare["tokens"], seconds["bare"], tokenizer, prompts, 1)
    return shard, plain


def print_engines(ours_runs: list[dict], vllm_runs: list[dict], bare_runs: list[dict], seconds: dict, tokenizer,
                  ours: Run) -> None:
    """Each engine's fixed cost and generation rate (each from its fastest repeat), the vLLM
    shard job against bare LLM.generate, the prompt count above which vLLM wins end to end, and
    greedy agreement between the engines."""
    ours_run, vllm = min(ours_runs, key=generating), min(vllm_runs, key=generating)
    bare = min(bare_runs, key=lambda run: run["generate_s"])
    shard, plain = engine_runs(vllm_runs[-1], bare_runs[-1], seconds, tokenizer, ours.prompts)
    rows = len(ours.texts)
    print(f"\n{'(own processes, end to end)':42}{'rows':>6}{'rows/s':>9}{'gen tok/s':>11}{'':>10}   seconds per run")
    for run in (ours, shard, plain):
        print(run.line())
    tf_gen, v_gen = generating(ours_run), generating(vllm)
    tf_fixed = min(run["wall"] - generating(run) for run in ours_runs)
    v_fixed = min(run["wall"] - generating(run) for run in vllm_runs)
    engine_start = min(run["stats"]["engine_start_s"] for run in vllm_runs)
    bare_import, bare_start = min(run["import_s"] for run in bare_runs), min(run["start_s"] for run in bare_runs)
    each = "/".join(f"{generating(run):.1f}" for run in vllm_runs)
    each_bare = "/".join(f"{run['generate_s']:.1f}" for run in bare_runs)
    print(f"fixed cost (process, imports, model load or engine start, writing; fastest repeat): transformers "
          f"{tf_fixed:.1f} s, vLLM {v_fixed:.1f} s (engine start {engine_start:.1f} s; bare: import "
          f"{bare_import:.1f} s, engine start {bare_start:.1f} s)")
    print(f"generate time (fastest repeat): transformers {tf_gen:.1f} s, vLLM shard job {v_gen:.1f} s, bare "
          f"LLM.generate {bare['generate_s']:.1f} s: shard job / bare = {v_gen / bare['generate_s']:.2f}x "
          f"(each repeat: {each} against {each_bare}); "
          f"vLLM / transformers rows/s while generating {tf_gen / v_gen:.2f}x, end to end "
          f"{min(seconds['ours']) / min(seconds['vllm']):.2f}x")
    per_row_gain = tf_gen / rows - v_gen / rows
    if per_row_gain > 0:
        print(f"vLLM wins end to end above ~{max(0, math.ceil((v_fixed - tf_fixed) / per_row_gain))} prompts "
              f"(fixed cost {v_fixed - tf_fixed:+.1f} s, {1000 * per_row_gain:.1f} ms less per prompt)")
    else:
        print("vLLM is not faster per prompt here, so it does not win end to end at any prompt count")
    for run, reference in ((shard, ours), (plain, shard)):
        bad = differing(reference, run)
        print(f"{run.name}: {rows - len(bad)} of {rows} rows ({1 - len(bad) / rows:.1%}) identical to "
              f"{reference.name}" + (f" (first differing: {bad[:5]})" if bad else ""))
