"""Sampling that is reproducible per row: a row's tokens depend only on its prompt, the seed and its
global row index — not on the shard count, the batch it lands in or the order of the rows.

The Gumbel-max trick makes sampling a greedy choice: with G_v independent standard Gumbel noise,
argmax_v(scores_v + G_v) is an exact draw from softmax(scores). So the generate loop stays greedy
and `GumbelSampler`, a logits processor, adds noise drawn from a stream of the row's own, keyed
by (seed, global row index, step, token id). The noise is a counter-based hash computed on the
device with integer operations over the whole (rows, vocabulary) matrix: no generator state, no
Python loop over rows or tokens, and the same numbers on every device.

The hash is Chris Wellons' `lowbias32` mixer on 32-bit words, in two independent lanes (a 64-bit
key per row and step, so two (row, step) pairs practically never share their noise); products are
split in 16-bit halves so int64 arithmetic never overflows.

Several samples of a row (`generate.n`): sample j's keys mix j into the row's keys once more, and
sample 0's are the row's own, bit for bit. So sample j depends only on (seed, row, j): the first
samples are the same under any n, and sample 0 is what n = 1 draws.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, TopPLogitsWarper

M32 = 0xFFFFFFFF
LANE_SALTS = (0x9E3779B9, 0x85EBCA6B)  # start values of the two key lanes
TOKEN_SALT = 0xC2B2AE35
SAMPLE_SALTS = (0x27D4EB2F, 0x165667B1)  # mixed with a sample's number j > 0, one per lane


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32), with every int64 product below 2**49."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijection of 32-bit words with near-ideal avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seed: int, index: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys per row for (seed, the rows' global index, step)."""
    words = (seed & M32, (seed >> 32) & M32, index & M32, (index >> 32) & M32, step & M32)
    lanes = []
    for salt in LANE_SALTS:
        key = torch.full_like(index, salt)
        for word in words:
            key = mix32(key ^ word)
        lanes.append(key)
    return lanes[0], lanes[1]


def sample_keys(seed: int, index: torch.Tensor, sample: torch.Tensor | None, step: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The row keys of each row's sample (`sample`: its number j per row; None: all 0): j > 0 mixes
    j into both lanes, j = 0 keeps the row's own keys."""
    lanes = row_keys(seed, index, step)
    if sample is None:
        return lanes
    j = sample.to(torch.int64) & M32
    later = j > 0
    return tuple(torch.where(later, mix32(lane ^ mix32(j ^ salt)), lane) for lane, salt in zip(lanes, SAMPLE_SALTS))


def uniform_bits(seed: int, index: torch.Tensor, step: int, vocab: int, sample: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """(rows, vocab) 32-bit words, one per (row, token), as int64."""
    first, second = sample_keys(seed, index.to(torch.int64), sample, step)
    tokens = mix32(torch.arange(vocab, device=index.device, dtype=torch.int64) ^ TOKEN_SALT)
    return mix32(mix32(first[:, None] ^ tokens[None, :]) ^ second[:, None])


def gumbel_noise(seed: int, index: torch.Tensor, step: int, vocab: int, sample: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Standard Gumbel noise, (rows, vocab) float64: -log(-log(u)) with u uniform in (0, 1)."""
    u = (uniform_bits(seed, index, step, vocab, sample).to(torch.float64) + 0.5) * 2.0**-32
    return -torch.log(-torch.log(u))


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens whose probabilities sum to top_p (at least one); the rest -inf."""
    return TopPLogitsWarper(top_p)(None, scores) if top_p < 1.0 else scores


class GumbelSampler(LogitsProcessor):
    """A logits processor for one batch: temperature, top_p, then
    per-row Gumbel noise, so that generate's greedy argmax draws each row's next token.

    `index`: the batch rows' global numbers, on the scores' device; `prompt_width`: the padded prompt
    width of the batch, so the step is the number of tokens generated so far; `sample`: each batch
    row's sample number (several samples of a row), None for sample 0 everywhere.
    """

    def __init__(self, seed: int, index: torch.Tensor, prompt_width: int, temperature: float = 1.0,
                 top_p: float = 1.0, sample: torch.Tensor | None = None) -> None:
        self.seed, self.index, self.prompt_width, self.sample = int(seed), index, prompt_width, sample
        self.temperature, self.top_p = float(temperature), float(top_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_width
        if self.temperature != 1.0:
            scores = scores / self.temperature
        scores = top_p_filter(scores, self.top_p)
        noise = gumbel_noise(self.seed, self.index, step, scores.shape[1], self.sample)
        return scores + noise.to(scores.dtype)
