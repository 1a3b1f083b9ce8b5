"""Sampler: greedy, and seeded temperature / top-k / top-p, batched and batch-invariant."""

from __future__ import annotations

import pytest
import torch

from tokenstate.runtime.sampler import SamplingRows, sample, uniform_draws


def rows(n: int, *, temperature=1.0, top_k=0, top_p=1.0, seeds=None, index=None) -> SamplingRows:
    def full(value, dtype):
        return value if isinstance(value, torch.Tensor) else torch.full((n,), value, dtype=dtype)

    temp = full(temperature, torch.float32)
    k, p = full(top_k, torch.int32), full(top_p, torch.float32)
    return SamplingRows(
        temperature=temp,
        top_k=k,
        top_p=p,
        seeds=seeds if seeds is not None else torch.arange(n, dtype=torch.int64),
        output_index=index if index is not None else torch.zeros(n, dtype=torch.int64),
        all_greedy=bool((temp == 0).all()),
        any_filter=bool(((k > 0) | (p < 1)).any()),
    )


def test_greedy_is_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    picked = sample(logits, rows(5, temperature=0.0))
    assert picked.dtype == torch.int32 and picked.tolist() == logits.argmax(1).tolist()


def test_greedy_breaks_ties_and_nans_as_argmax_does():
    # Ties to the first index and NaN as the largest value: the rules HF's greedy decoding uses.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 3, (64, 4096), generator=gen).float()  # [64, 4096]: many ties per row
    logits[::5, 17] = float("nan")
    logits[::7, 3] = float("nan")
    logits[1::9] = float("-inf")
    picked = sample(logits, rows(64, temperature=0.0))
    assert picked.tolist() == logits.argmax(1).tolist()


def test_uniform_draws_are_a_pure_function_in_the_open_unit_interval():
    seeds = torch.arange(4000, dtype=torch.int64) * 1_000_003 + 2**61
    index = torch.arange(4000, dtype=torch.int64) % 7
    u = uniform_draws(seeds, index)
    assert u.shape == (4000,) and float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert torch.equal(u[5:9], uniform_draws(seeds[5:9], index[5:9]))  # row-independent
    assert not torch.equal(uniform_draws(seeds[:1], index[:1] + 1), u[:1])  # the index matters
    assert abs(float(u.mean()) - 0.5) < 0.02
    assert torch.histc(u, bins=10, min=0, max=1).min() > 300  # roughly flat


def test_seeded_sampling_does_not_depend_on_the_batch_around_a_row():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 64, generator=gen)
    seeds = torch.tensor([11, 12, 13, 14, 15, 16])
    index = torch.tensor([0, 1, 2, 3, 4, 5])
    together = sample(
        logits, rows(6, temperature=0.9, top_k=20, top_p=0.9, seeds=seeds, index=index)
    )
    for r in (0, 3, 5):
        alone = sample(
            logits[r : r + 1],
            rows(
                1,
                temperature=0.9,
                top_k=20,
                top_p=0.9,
                seeds=seeds[r : r + 1],
                index=index[r : r + 1],
            ),
        )
        assert alone.tolist() == together[r : r + 1].tolist()
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    shuffled = sample(
        logits[perm],
        rows(6, temperature=0.9, top_k=20, top_p=0.9, seeds=seeds[perm], index=index[perm]),
    )
    assert shuffled.tolist() == together[perm].tolist()


def test_mixed_greedy_and_random_rows():
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    temp = torch.tensor([0.0, 1.0, 0.0, 1.0])
    picked = sample(logits, rows(4, temperature=temp))
    assert picked[0] == logits[0].argmax() and picked[2] == logits[2].argmax()


def _draws(logits: torch.Tensor, n: int, **kw) -> torch.Tensor:
    """``n`` draws from one row's distribution, via ``n`` seeds in one batch."""
    batch = logits.expand(n, -1)
    return sample(batch, rows(n, seeds=torch.arange(n, dtype=torch.int64) * 7 + 3, **kw)).long()


def test_draws_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    freq = torch.bincount(_draws(logits, 20000), minlength=4).float() / 20000
    assert torch.allclose(freq, torch.softmax(logits[0], 0), atol=0.015)
    hot = torch.bincount(_draws(logits, 20000, temperature=2.0), minlength=4).float() / 20000
    assert torch.allclose(hot, torch.softmax(logits[0] / 2.0, 0), atol=0.015)


@pytest.mark.parametrize(
    ("kw", "allowed"),
    [({"top_k": 2}, {0, 1}), ({"top_p": 0.8}, {0, 1}), ({"top_k": 3, "top_p": 0.5}, {0})],
)
def test_top_k_and_top_p_restrict_the_support(kw, allowed):
    logits = torch.tensor([[3.0, 2.5, 0.0, -1.0, -2.0]])  # softmax ≈ [0.60, 0.37, 0.03, 0.01, 0.00]
    seen = set(_draws(logits, 4000, **kw).tolist())
    assert seen == allowed
