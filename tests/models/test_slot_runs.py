"""Short rows are attended per run of consecutive slots, reading the KV caches in place.

Rows in scattered slots (holes between them, more gaps than runs, rows out of slot order, decode
rows with drafts next to plain decode rows) give the logits each row gets alone, and no step ever
copies a cache (no gather): the caches are only viewed, written in place and read by attention.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tokenstate.models import slot_batch
from tokenstate.models.llama import FACTORY

VOCAB = 512  # tiny-llama
NUM_SLOTS = 200
SLOTS = [150, 2, 3, 17, 9, 10, 11, 60, 0, 190]  # small gaps (a run spans them) and wide ones (cuts)


def _prompt(slot: int) -> list[int]:
    return [(7 * slot + 3 * j) % (VOCAB - 3) + 3 for j in range(5 + slot % 7)]


def _model(preset: str, dtype: torch.dtype):
    return FACTORY.build_preset(preset).to(dtype)


def _solo_logits(make_input, preset: str = "tiny-llama", dtype: torch.dtype = torch.float32) -> dict[int, torch.Tensor]:
    """Each request's decode-step logits, run alone in slot 0 of its own model."""
    model = _model(preset, dtype)
    model.allocate_slots(1)
    solo = {}
    for slot in SLOTS:
        model.reset_slot(0)
        prompt = _prompt(slot)
        FACTORY.forward(model, make_input([(0, prompt)], vocab_size=VOCAB))
        drafts = 2 if slot % 3 == 0 else 0
        solo[slot] = FACTORY.forward(
            model, make_input([(0, [slot + 4, 9, 8][: 1 + drafts], len(prompt), drafts)], vocab_size=VOCAB)
        )
    return solo


def _crowded_step(make_input, preset: str = "tiny-llama", dtype: torch.dtype = torch.float32):
    model = _model(preset, dtype)
    model.allocate_slots(NUM_SLOTS)
    for slot in SLOTS:
        FACTORY.forward(model, make_input([(slot, _prompt(slot))], vocab_size=VOCAB))
    rows = []
    for slot in SLOTS:
        drafts = 2 if slot % 3 == 0 else 0
        rows.append((slot, [slot + 4, 9, 8][: 1 + drafts], len(_prompt(slot)), drafts))
    return model, make_input(rows, vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("preset", "dtype", "atol"),
    [
        ("tiny-llama", torch.float32, 1e-5),
        ("tiny-llama-gqa", torch.float32, 1e-5),  # 4 query heads a KV head, folded with the drafts
        ("tiny-llama-gqa", torch.bfloat16, 2e-2),  # the float32 key bias meets bfloat16 queries
    ],
    ids=["mha", "gqa", "gqa-bf16"],
)
def test_scattered_slots_give_every_row_its_solo_logits(make_input, preset, dtype, atol):
    solo = _solo_logits(make_input, preset, dtype)
    model, inp = _crowded_step(make_input, preset, dtype)
    batch = slot_batch.SlotBatch.from_input(inp, num_slots=NUM_SLOTS, max_model_len=model.max_model_len)
    assert batch.short_rows is not None
    runs = batch.short_rows.runs
    assert [(r.slot_lo, r.slot_hi) for r in runs] == [(0, 18), (60, 61), (150, 151), (190, 191)]
    logits = FACTORY.forward(model, inp)
    taken = 0
    for slot in SLOTS:
        n = solo[slot].shape[0]
        torch.testing.assert_close(logits[taken : taken + n], solo[slot], rtol=0, atol=atol)
        taken += n


class _CacheReads(TorchDispatchMode):
    """Records every op that takes one of ``caches`` (or a view of it) as an input."""

    def __init__(self, caches: list[torch.Tensor]) -> None:
        super().__init__()
        self.storages = {c.untyped_storage().data_ptr() for c in caches}
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [*args, *(kwargs or {}).values()]
        flat += [t for a in list(flat) if isinstance(a, list | tuple) for t in a]
        if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.storages for t in flat):
            self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


VIEW_WRITE_OR_ATTEND = {
    "slice", "transpose", "select", "view", "as_strided", "alias", "unsqueeze", "t",
    "index_put_", "_index_put_impl_", "copy_",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
}  # fmt: skip


def test_a_decode_step_never_copies_a_kv_cache(make_input):
    model, inp = _crowded_step(make_input)
    caches = [t for layer in model.model.layers for t in (layer.self_attn.k_cache, layer.self_attn.v_cache)]
    with _CacheReads(caches) as reads:
        FACTORY.forward(model, inp)
    assert "_scaled_dot_product_flash_attention_for_cpu" in reads.ops or "scaled_dot_product_attention" in reads.ops
    assert reads.ops <= VIEW_WRITE_OR_ATTEND, f"ops that copy a cache: {sorted(reads.ops - VIEW_WRITE_OR_ATTEND)}"


def _cost(slots: list[int], lens: list[int], runs: list[tuple[int, int]]) -> int:
    return sum((slots[j] - slots[i] + 1) * max(lens[i : j + 1]) + slot_batch.RUN_COST_KEYS for i, j in runs)


def test_runs_cover_every_row_and_cost_no_more_than_one_run_or_a_run_per_row():
    gen = np.random.default_rng(0)
    for _ in range(200):
        num = int(gen.integers(1, 40))
        slots = sorted(gen.choice(300, num, replace=False).tolist())
        lens = gen.integers(1, 700, num).tolist()
        runs = slot_batch._slot_runs(np.array(slots), np.array(lens))
        assert [i for a, b in runs for i in range(a, b + 1)] == list(range(num))
        cost = _cost(slots, lens, runs)
        assert cost <= _cost(slots, lens, [(0, num - 1)])
        assert cost <= _cost(slots, lens, [(i, i) for i in range(num)])
    # Neighbouring slots of similar length share a run; a far-away long row gets its own.
    assert slot_batch._slot_runs(np.array([4, 5, 6, 200]), np.array([300, 290, 310, 600])) == [(0, 2), (3, 3)]
