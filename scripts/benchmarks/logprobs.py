"""What turning vLLM's log-probabilities into the `logprobs` column costs, per part, without an
engine, so that it can be measured apart from the engine's own work on a shared machine: the same
sampler outputs (rows x steps positions, the chosen token and the top k each) as vLLM's output
processor stores them and as the shard job reads them, the old way (per-position dicts, a Python
sort per position, a token text looked up per position) against the current one (vLLM's flat
lists read as reshapes, token texts as an Arrow take over the distinct ids).

    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.logprobs --rows 64 --steps 32 --k 5

Each part runs `--repeats` times, old and new in turn; the median counts.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
import pyarrow as pa

from shardinfer.engines.vllm.matching import sample_logprobs
from shardinfer.tasks.generate.logprobs import SampleLogprobs, TokenTexts, logprobs_array


def dict_sample_logprobs(positions: list[dict], tokens: np.ndarray, k: int) -> SampleLogprobs:
    """The reading as it was, from vLLM's per-position dicts {token id: Logprob} (a Python sort per
    position): the naive way, and the reference the flat reading must equal (tests)."""
    chosen = np.zeros(len(tokens), dtype=np.float32)
    top_ids, top_values = np.zeros((len(tokens), k), dtype=np.int32), np.zeros((len(tokens), k), dtype=np.float32)
    for step, (token, entries) in enumerate(zip(tokens.tolist(), positions)):
        chosen[step] = entries[token].logprob
        ranked = sorted((entry.rank, -entry.logprob, token_id) for token_id, entry in entries.items()
                        if entry.rank is not None and entry.rank <= k)
        top_ids[step] = [token_id for *_, token_id in ranked[:k]]
        top_values[step] = [-value for _, value, _ in ranked[:k]]
    return SampleLogprobs(chosen, top_ids, top_values)


class PerPositionTexts(TokenTexts):
    """The token texts as they were: decoded once per id, then looked up once per position."""

    def of(self, ids: np.ndarray) -> pa.Array:
        super().of(ids)
        return pa.array([self.known[int(i)] for i in ids], pa.string())


def engine_logprobs(steps: list[tuple[list[int], list[float], int]], k: int, flat: bool):
    """A completion's log-probabilities stored by vLLM's own output-processor function."""
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    positions = create_sample_logprobs(flat)
    for ids, values, rank in steps:
        append_logprobs_for_next_position(positions, ids, values, itertools.repeat(None), rank, k)
    return positions


def sampler_outputs(rows: int, steps: int, k: int, vocab: int) -> list[tuple[list, np.ndarray]]:
    """Per row, per step: the sampler's ids and values (chosen first, then the top k) and the chosen's rank."""
    generator = np.random.default_rng(0)
    found = []
    for _ in range(rows):
        row, tokens = [], []
        for _ in range(steps):
            ids = generator.choice(vocab, k + 1, replace=False)
            values = np.sort(generator.normal(-3, 2, k + 1))[::-1]
            row.append(([int(ids[0]), *map(int, ids[1:])], [float(values[0]), *map(float, values[1:])], 1))
            tokens.append(int(ids[0]))
        found.append((row, np.asarray(tokens, dtype=np.int64)))
    return found


def one_way(outputs, k: int, tokenizer, flat: bool) -> dict[str, float]:
    """Seconds of each part for all rows: vLLM storing, the shard job reading, the column."""
    times = {}
    started = time.perf_counter()
    stored = [engine_logprobs(steps, k, flat) for steps, _ in outputs]
    times["vLLM stores"] = time.perf_counter() - started
    started = time.perf_counter()
    read = [sample_logprobs(p, t, k, 0) if flat else dict_sample_logprobs(list(p), t, k)
            for p, (_, t) in zip(stored, outputs)]
    times["shard job reads"] = time.perf_counter() - started
    texts = (TokenTexts if flat else PerPositionTexts)(tokenizer)
    started = time.perf_counter()
    for sample in read:  # each distinct id decoded once per job, the same both ways
        texts.of(sample.top_ids.reshape(-1))
    times["token texts decoded (once per id per job)"] = time.perf_counter() - started
    started = time.perf_counter()
    logprobs_array([t for _, t in outputs], read, texts)
    times["column built"] = time.perf_counter() - started
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from benchmarks.common import byte_level_bpe

    tokenizer = byte_level_bpe(vocab_size=8000, pad_token="<|pad|>")
    outputs = sampler_outputs(args.rows, args.steps, args.k, len(tokenizer))
    runs = {"old": [], "new": []}
    for _ in range(args.repeats):
        runs["old"].append(one_way(outputs, args.k, tokenizer, flat=False))
        runs["new"].append(one_way(outputs, args.k, tokenizer, flat=True))
    print(f"{args.rows} rows x {args.steps} tokens, top {args.k}: median ms of {args.repeats}, old / new")
    for part in runs["old"][0]:
        old, new = (statistics.median(run[part] for run in runs[way]) * 1e3 for way in ("old", "new"))
        print(f"  {part:40}{old:9.1f}{new:9.1f}")
    old, new = (statistics.median(sum(run.values()) for run in runs[way]) * 1e3 for way in ("old", "new"))
    print(f"  {'all':40}{old:9.1f}{new:9.1f}   ({old / max(new, 1e-9):.1f}x)")


if __name__ == "__main__":
    main()
