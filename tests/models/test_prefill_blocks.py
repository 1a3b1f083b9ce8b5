"""A prefill chunk on the CPU is attended in blocks of ``PREFILL_BLOCK`` queries, each over the keys
up to its own last query, masked by a view of one shared table — and gives what one causal call over
the whole chunk gives, for chunks that start a sequence and chunks that continue one, grouped KV
heads, value heads wider than key heads (MLA) and bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tokenstate.models import layers
from tokenstate.models.slot_batch import LongRow, SlotBatch, _SlotPlan

MAX_LEN = 512
SLOT = 2


def _reference(q, k_cache, v_cache, chunk: LongRow, scale: float) -> torch.Tensor:
    """One dense attention over the chunk, each query up to its own position (math path)."""
    keys = k_cache[chunk.slot, :, : chunk.seq_len].float()  # [kv_heads, S, d]
    values = v_cache[chunk.slot, :, : chunk.seq_len].float()  # [kv_heads, S, dv]
    queries = q[chunk.start : chunk.end].transpose(0, 1).float()  # [heads, n, d]
    group = queries.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    positions = torch.arange(chunk.num_computed, chunk.seq_len)[:, None]  # [n, 1]
    readable = torch.arange(chunk.seq_len)[None, :] <= positions  # [n, S]
    scores = (queries @ keys.transpose(1, 2)) * scale  # [heads, n, S]
    weights = scores.masked_fill(~readable, float("-inf")).softmax(-1)
    return (weights @ values).transpose(0, 1)  # [n, heads, dv]


@pytest.mark.parametrize(
    ("done", "n"),
    [(0, 17), (0, 64), (0, 65), (0, 200), (0, 129), (37, 17), (100, 150), (5, 64), (300, 211)],
)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "dv", "dtype", "atol"),
    [
        (8, 4, 32, 32, torch.float32, 2e-5),
        (4, 4, 16, 24, torch.float32, 2e-5),  # MLA-like: values wider than keys, no grouping
        (8, 2, 32, 32, torch.bfloat16, 3e-2),
    ],
    ids=["gqa", "mha-wide-values", "gqa-bf16"],
)
def test_blocked_prefill_matches_one_causal_attention(done, n, heads, kv_heads, d, dv, dtype, atol):
    gen = torch.Generator().manual_seed(done * 1000 + n)
    k_cache = torch.randn(4, kv_heads, MAX_LEN, d, generator=gen).to(dtype)
    v_cache = torch.randn(4, kv_heads, MAX_LEN, dv, generator=gen).to(dtype)
    q = torch.randn(n, heads, d, generator=gen).to(dtype)
    k = torch.randn(n, kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(n, kv_heads, dv, generator=gen).to(dtype)
    batch = SlotBatch.bind(_plan_of(done, n), (), torch.device("cpu"))
    (chunk,) = batch.long_rows
    assert chunk.key_mask is None  # on the CPU, blocks read the shared table instead
    out = layers.slot_attention(q, k, v, k_cache, v_cache, batch, scale=d**-0.5)
    # slot_attention wrote the chunk's K/V first, so the reference reads the same caches.
    expected = _reference(q, k_cache, v_cache, chunk, d**-0.5)
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=atol)


def test_a_continuing_chunk_with_its_own_mask_is_attended_in_one_call(monkeypatch):
    """Off the CPU ``bind`` gives a continuing chunk its mask and the chunk is attended in one call;
    the same branch, driven on the CPU with the mask ``bind`` would make there."""
    done, n, heads, d = 40, 90, 4, 16
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache = torch.randn(4, heads, MAX_LEN, d, generator=gen), torch.randn(4, heads, MAX_LEN, d, generator=gen)
    q, k, v = (torch.randn(n, heads, d, generator=gen) for _ in range(3))
    seq_len = done + n
    mask = (torch.arange(seq_len)[None, :] <= torch.arange(done, seq_len)[:, None])[None, None]
    chunk = LongRow(SLOT, 0, n, done, seq_len, mask)
    calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(kw) or real_sdpa(*a, **kw))
    out = layers.slot_attention(q, k, v, k_cache, v_cache, SlotBatch(None, (chunk,)), scale=d**-0.5)
    assert len(calls) == 1 and calls[0]["attn_mask"] is mask
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, chunk, d**-0.5), rtol=0, atol=2e-5)


def test_a_long_chunk_is_split_into_blocks_over_growing_keys(monkeypatch):
    calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        layers.F, "scaled_dot_product_attention",
        lambda q, k, *a, **kw: calls.append((q.shape[2], k.shape[2], kw["is_causal"])) or real_sdpa(q, k, *a, **kw),
    )  # fmt: skip
    block = layers.PREFILL_BLOCK
    n = 2 * block + 10
    q, k, v = torch.randn(n, 2, 8), torch.randn(n, 2, 8), torch.randn(n, 2, 8)
    caches = torch.zeros(4, 2, MAX_LEN, 8), torch.zeros(4, 2, MAX_LEN, 8)
    layers.slot_attention(q, k, v, *caches, SlotBatch.bind(_plan_of(0, n), (), torch.device("cpu")), scale=1.0)
    assert calls == [(block, block, True), (block, 2 * block, False), (10, n, False)]


def _plan_of(done: int, n: int):
    """The host plan of a step with one prefill chunk of ``n`` tokens after ``done`` in slot SLOT."""
    return _SlotPlan(None, ((SLOT, 0, n, done),))


def test_the_shared_bias_table_made_while_serving_still_serves_a_forward_with_gradients():
    """The table is made once, usually inside a serving step's ``inference_mode``; a later forward
    that records gradients (fine-tuning through the model) must still be able to read it."""
    layers._block_causal_bias.cache_clear()
    n, heads, d = 2 * layers.PREFILL_BLOCK, 2, 8
    caches = torch.zeros(4, heads, MAX_LEN, d), torch.zeros(4, heads, MAX_LEN, d)
    batch = SlotBatch.bind(_plan_of(0, n), (), torch.device("cpu"))
    with torch.inference_mode():
        layers.slot_attention(*(torch.randn(n, heads, d) for _ in range(3)), *caches, batch, scale=1.0)
    q = torch.randn(n, heads, d, requires_grad=True)
    out = layers.slot_attention(q, torch.randn(n, heads, d), torch.randn(n, heads, d), *caches, batch, scale=1.0)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape
