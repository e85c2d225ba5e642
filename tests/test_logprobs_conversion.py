"""Log-probabilities from the engines into the `logprobs` column, without an engine: vLLM's flat
container (built by vLLM's own functions) read as arrays must give exactly what the per-position
dicts gave (the old reading, kept as the naive way in scripts/benchmarks/logprobs.py), and the column
built from flat arrays must hold each position's token text, id and value as `generate_logprobs`
documents them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.logprobs import dict_sample_logprobs, engine_logprobs
from shardinfer.core.errors import UserError
from shardinfer.engines.vllm.matching import rows_results, sample_logprobs
from shardinfer.tasks.generate.logprobs import SampleLogprobs, TokenTexts, logprobs_array
from shardinfer.tasks.generate.params import RowParams
from tiny_models import save_bytes_tokenizer


def test_a_rows_samples_come_in_their_order_with_their_log_probabilities():
    """vLLM numbers a row's n completions (here handed back in reverse); each position holds the
    chosen token (any rank) and the top k by rank: they become the chosen's value and the top k in order."""
    positions = engine_logprobs([([4, 4, 7], [-0.5, -0.5, -1.5], 1), ([3, 8, 9], [-2.0, -0.1, -0.9], 3)], 2, flat=True)
    completions = [SimpleNamespace(index=j, token_ids=[4, 3], finish_reason="stop", stop_reason=None,
                                   logprobs=positions) for j in range(3)][::-1]
    asked = RowParams(max_new_tokens=4, do_sample=True, n=3, logprobs=2)
    got = rows_results([SimpleNamespace(prompt_token_ids=[2], outputs=completions)], [[2]], [10], [3], [asked])
    (row,) = got["completions"]
    assert len(row) == 3 and all(c.tokens.tolist() == [4, 3] and c.finish == 1 for c in row)
    lp = row[0].logprobs
    assert lp.chosen.tolist() == [-0.5, -2.0]
    assert lp.top_ids.tolist() == [[4, 7], [8, 9]] and np.allclose(lp.top_values, [[-0.5, -1.5], [-0.1, -0.9]])


def sampler_steps(k: int, steps: int = 40) -> tuple[list, np.ndarray]:
    """Fixed sampler outputs: per step the chosen token (rank 1, inside the top k or outside it) and the top k."""
    generator = np.random.default_rng(k)
    found, tokens = [], []
    for step in range(steps):
        values = np.sort(generator.normal(-3, 2, k + 8).astype(np.float32))[::-1]
        ranked = generator.permutation(500)[: k + 8]
        rank = int(generator.integers(1, k + 8)) if step % 3 else 1
        found.append(([int(ranked[rank - 1]), *map(int, ranked[:k])],
                      [float(values[rank - 1]), *map(float, values[:k])], rank))
        tokens.append(int(ranked[rank - 1]))
    return found, np.asarray(tokens, dtype=np.int64)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_flat_log_probabilities_give_what_the_per_position_dicts_gave(k):
    """The same sampler output stored flat and as dicts: the flat reading equals the old dict reading."""
    steps, tokens = sampler_steps(k)
    flat = sample_logprobs(engine_logprobs(steps, k, flat=True), tokens, k, row=0)
    old = dict_sample_logprobs(list(engine_logprobs(steps, k, flat=False)), tokens, k)
    for name in ("chosen", "top_ids", "top_values"):
        assert getattr(flat, name).dtype == getattr(old, name).dtype
        assert np.array_equal(getattr(flat, name), getattr(old, name))


def test_flat_log_probabilities_of_other_tokens_fail_the_row():
    positions = engine_logprobs([([4, 4], [-0.5, -0.5], 1), ([3, 8], [-2.0, -0.1], 2)], 1, flat=True)
    with pytest.raises(UserError, match="^row 7: vLLM returned log-probabilities of other tokens"):
        sample_logprobs(positions, np.array([4, 5]), 1, row=7)
    with pytest.raises(UserError, match="^row 7: vLLM returned other than the chosen and top 2"):
        sample_logprobs(positions, np.array([4, 3]), 2, row=7)


def test_the_column_holds_each_positions_text_id_and_values(tmp_path):
    """Built from flat arrays with each distinct id decoded once, the column equals the documented
    shape written out position by position (a sample that asked none is null; k may differ per sample)."""
    tokenizer = save_bytes_tokenizer(tmp_path)
    generator = np.random.default_rng(0)
    tokens = [generator.integers(0, len(tokenizer), size) for size in (5, 0, 7, 3)]
    ks = [3, 2, None, 0]
    samples = [None if k is None else SampleLogprobs(generator.normal(-2, 1, len(t)).astype(np.float32),
                                                     generator.integers(0, len(tokenizer), (len(t), k), np.int32),
                                                     generator.normal(-2, 1, (len(t), k)).astype(np.float32))
               for t, k in zip(tokens, ks)]
    texts = TokenTexts(tokenizer)
    got = [logprobs_array(tokens, samples, texts).to_pylist(), logprobs_array(tokens, samples, texts).to_pylist()]

    def entry(token, value) -> dict:
        return {"token": tokenizer.decode([int(token)]), "token_id": int(token), "logprob": float(value)}

    expected = [None if s is None else [{**entry(t, v), "top_logprobs": [entry(i, x) for i, x in zip(ids, xs)]}
                                        for t, v, ids, xs in zip(ts, s.chosen, s.top_ids, s.top_values)]
                for ts, s in zip(tokens, samples)]
    assert got == [expected, expected]  # the second time from the texts decoded already
