"""Batched sampling: greedy, and seeded temperature / top-k / top-p, with no per-row Python loop.

Randomness is counter-based: a row's uniform draw is a fixed integer hash of (request seed, output
index), computed on the execution device for all rows at once. A request's tokens are therefore a
pure function of its seed and its logits — the same whatever other requests share the batch,
whichever row it lands in, whether the engine schedules synchronously or asynchronously, and on the
CPU or a GPU. Sampling inverts the row's cumulative distribution at that draw (exact sampling from
``p``), using only row-wise reductions (max, sum, cumsum, searchsorted) so that a row's result does
not depend on the rows around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingRows", "sample", "sample_greedy", "uniform_draws"]

_MASK32 = 0xFFFFFFFF
# Multipliers below 2**31 keep every product of a 32-bit value inside int64: no overflow, no UB.
_MIX = 0x45D9F3B
_GOLDEN = 0x61C88647


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK32
    return x ^ (x >> 16)


def uniform_draws(seeds: torch.Tensor, output_index: torch.Tensor) -> torch.Tensor:
    """``[rows]`` float32 uniforms in ``(0, 1)``, a pure function of (seed, output index).

    Args:
        seeds: ``[rows]`` int64 in ``[0, 2**62)``.
        output_index: ``[rows]`` int64, index of the token being sampled in the request's output.
    """
    key = _mix32(seeds & _MASK32)  # [rows] int64
    key = _mix32((key + ((seeds >> 31) & _MASK32) * _GOLDEN) & _MASK32)
    key = _mix32((key + (output_index & _MASK32) * _GOLDEN) & _MASK32)
    # 24 high bits -> a float32 exactly representable, strictly inside (0, 1).
    return ((key >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


@dataclass(frozen=True, slots=True)
class SamplingRows:
    """Per-row sampling parameters on the execution device, plus host-known fast-path flags."""

    temperature: torch.Tensor  # [rows] float32, 0 = greedy
    top_k: torch.Tensor  # [rows] int32, 0 = off
    top_p: torch.Tensor  # [rows] float32, 1 = off
    seeds: torch.Tensor  # [rows] int64
    output_index: torch.Tensor  # [rows] int64
    all_greedy: bool
    any_filter: bool  # some row uses top-k or top-p


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax of ``[rows, vocab]`` from elementwise ops and row reductions.

    ``torch.softmax`` on the CPU opens a thread pool for every call (milliseconds on a loaded
    machine, for a few rows); this costs microseconds. Rows never mix, so a row's probabilities do
    not depend on its neighbours (bit for bit whenever the vocabulary is a multiple of the SIMD
    width, as every test model's is; otherwise at most in the last bit of a tail element).
    """
    e = (x - x.amax(dim=1, keepdim=True)).exp()  # [rows, vocab]; -inf -> 0
    return e / e.sum(dim=1, keepdim=True)


def _filter_top_k_top_p(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set logits outside each row's top-k, then outside its top-p nucleus, to -inf."""
    vocab = scaled.shape[1]
    sorted_logits, order = scaled.sort(dim=1, descending=True)  # [rows, vocab] each
    rank = torch.arange(vocab, device=scaled.device)  # [vocab]
    k = torch.where(top_k > 0, top_k, vocab).unsqueeze(1)  # [rows, 1]
    keep = rank < k  # [rows, vocab] bool, in sorted order
    probs = _softmax_rows(sorted_logits.masked_fill(~keep, float("-inf")))  # [rows, vocab]
    # Keep a token while the probability mass *before* it is below top_p: the first always stays.
    keep &= (probs.cumsum(dim=1) - probs) < top_p.unsqueeze(1)
    keep_original = torch.empty_like(keep).scatter_(1, order, keep)  # [rows, vocab] bool
    return scaled.masked_fill(~keep_original, float("-inf"))


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    """``[rows]`` int64: each row's first largest logit (a NaN counts as largest, as in argmax).

    On the CPU ``max(dim).indices`` is argmax with the same tie and NaN rules, and measured about
    3x faster than ``argmax`` over a 32k vocabulary (~0.2 vs ~0.65 ms at 16 rows, one thread, torch
    2.13). CUDA keeps ``argmax``: there the tie rule of ``max(dim)`` is not documented.
    """
    if logits.device.type == "cpu":
        return logits.max(dim=1).indices
    return logits.argmax(dim=1)


def sample_greedy(logits: torch.Tensor) -> torch.Tensor:
    """``[rows]`` int32: each row's argmax token — :func:`sample` when every row is greedy, which
    reads no per-row parameter (a caller that knows it gathers none)."""
    return _greedy(logits).to(torch.int32)


def sample(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """Sample one token per row of ``logits`` (``[rows, vocab]`` float32) → ``[rows]`` int32."""
    if rows.all_greedy:
        return sample_greedy(logits)
    greedy_pick = _greedy(logits)  # [rows] int64
    is_greedy = rows.temperature == 0  # [rows] bool
    temperature = torch.where(is_greedy, torch.ones_like(rows.temperature), rows.temperature)
    # The row's best logit subtracted first: every scaled logit is then <= 0 whatever the
    # temperature (a tiny one sends the rest to -inf, never the best to inf: no NaN in softmax).
    best = logits.gather(1, greedy_pick.unsqueeze(1))  # [rows, 1]: the greedy pick's logit, no second scan
    scaled = (logits - best) / temperature.unsqueeze(1)  # [rows, vocab]
    if rows.any_filter:
        scaled = _filter_top_k_top_p(scaled, rows.top_k, rows.top_p)
    probs = _softmax_rows(scaled)  # [rows, vocab]
    cdf = probs.cumsum(dim=1)  # [rows, vocab]
    # The first token whose cumulative mass exceeds the draw (scaled by the row's total, which
    # rounding keeps a hair away from 1); tokens filtered to probability 0 can never be that token.
    target = uniform_draws(rows.seeds, rows.output_index) * cdf[:, -1]  # [rows]
    random_pick = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(
        1
    )  # [rows] int64
    random_pick = random_pick.clamp(max=logits.shape[1] - 1)
    return torch.where(is_greedy, greedy_pick, random_pick).to(torch.int32)
