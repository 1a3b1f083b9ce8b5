"""Per-slot state: rows never read or write another request's slot; device ids are honoured."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tokenstate.contracts import StaleHostTokensError
from tokenstate.models import slot_batch
from tokenstate.models.llama import FACTORY
from tokenstate.runtime.kernels import EmbeddedBadIdsError

VOCAB = 512  # tiny-llama


def caches(model) -> list[torch.Tensor]:
    return [t for layer in model.model.layers for t in (layer.self_attn.k_cache, layer.self_attn.v_cache)]


def assert_rows_isolated(make_input) -> None:
    """A request's logits do not depend on its batch neighbours, and idle slots stay untouched.

    Rows sit in slots different from their batch row index, so writing K/V by row instead of by
    slot (or into a neighbour's slot) changes the logits or dirties a slot.
    """
    a, b, c = [5, 9, 11, 3, 7, 8], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57], [99, 98]
    alone = FACTORY.build_preset("tiny-llama")
    alone.allocate_slots(4)
    solo = [FACTORY.forward(alone, make_input([(2, a)], vocab_size=VOCAB))]
    solo.append(FACTORY.forward(alone, make_input([(2, [17], len(a))], vocab_size=VOCAB)))

    crowded = FACTORY.build_preset("tiny-llama")
    crowded.allocate_slots(4)
    FACTORY.forward(crowded, make_input([(1, [1, 2, 3])], vocab_size=VOCAB))
    idle_before = [t[1].clone() for t in caches(crowded)]
    step1 = FACTORY.forward(crowded, make_input([(3, b), (2, a), (0, c)], vocab_size=VOCAB))
    step2 = FACTORY.forward(
        crowded, make_input([(0, [4], len(c)), (2, [17], len(a)), (3, [6], len(b))], vocab_size=VOCAB)
    )
    torch.testing.assert_close(step1[1], solo[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(step2[1], solo[1][0], rtol=0, atol=1e-5)
    for before, cache in zip(idle_before, caches(crowded), strict=True):
        assert torch.equal(cache[1], before), "a row wrote into slot 1, which was not in its batch"
    for cache in caches(crowded):
        assert not cache[2, len(a) + 1 :].any(), "slot 2 holds K/V beyond its own sequence"


def test_rows_in_one_batch_never_touch_each_others_slots(make_input):
    assert_rows_isolated(make_input)


def test_the_isolation_check_catches_a_scatter_by_row_instead_of_slot(make_input, monkeypatch):
    original = slot_batch.SlotBatch.from_input.__func__

    def scatter_by_row(cls, inp, **kwargs):
        batch = original(cls, inp, **kwargs)
        short = [r for r in inp.layout.rows if r.query_len <= slot_batch.DEFAULT_MAX_SHORT_QUERY_LEN]
        # The bug: K/V of each short row land in the cache of its batch row, not of its slot.
        by_row = torch.tensor([r.row for r in short for _ in range(r.query_len)])  # [num_short_tokens]
        return dataclasses.replace(batch, short_rows=dataclasses.replace(batch.short_rows, write_slots=by_row))

    monkeypatch.setattr(slot_batch.SlotBatch, "from_input", classmethod(scatter_by_row))
    with pytest.raises(AssertionError):
        assert_rows_isolated(make_input)


def test_reset_slot_zeroes_only_that_slot(make_input):
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(3)
    FACTORY.forward(model, make_input([(0, [5, 6, 7]), (2, [8, 9])], vocab_size=VOCAB))
    kept = [t[2].clone() for t in caches(model)]
    model.reset_slot(0)
    for before, cache in zip(kept, caches(model), strict=True):
        assert not cache[0].any()
        assert torch.equal(cache[2], before) and cache[2].any()


def test_reset_slot_clears_every_cell_a_prefill_chunk_a_decode_run_or_a_draft_wrote(make_input):
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(6)
    long_prompt = list(range(10, 30))  # 20 tokens: a long (prefill) row
    FACTORY.forward(model, make_input([(1, long_prompt[:18]), (4, [5, 6, 7])], vocab_size=VOCAB))
    FACTORY.forward(model, make_input([(1, long_prompt[18:], 18), (4, [8], 3)], vocab_size=VOCAB))
    # A decode run over slots 1..4 (holes 2 and 3), slot 4 with two drafts: cells up to 6 written.
    FACTORY.forward(model, make_input([(1, [31], 20), (4, [9, 10, 11], 4, 2)], vocab_size=VOCAB))
    FACTORY.forward(model, make_input([(0, [3, 4]), (5, long_prompt)], vocab_size=VOCAB))  # 5: one long row
    written = model.model._written
    assert written[1] >= 21 and written[4] >= 7 and written[0] >= 2 and written[5] >= 20
    kept = [t[0].clone() for t in caches(model)]
    for slot in (1, 4, 5, 2):  # 2 was a hole of the run: nothing of it to clear
        model.reset_slot(slot)
        assert written[slot] == 0
    for before, cache in zip(kept, caches(model), strict=True):
        assert not cache[1:].any(), "a reset slot still holds K/V its previous request wrote"
        assert torch.equal(cache[0], before) and cache[0].any()
    FACTORY.forward(model, make_input([(1, [7, 8, 9])], vocab_size=VOCAB))
    assert written[1] >= 3  # tracking starts again for the new request


def test_device_ids_are_embedded_when_the_host_holds_placeholders(make_input):
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(4)
    prefill = [(1, [5, 6, 7, 8]), (3, [9, 10, 11])]
    fresh_model = FACTORY.build_preset("tiny-llama")
    fresh_model.allocate_slots(4)
    FACTORY.forward(model, make_input(prefill, vocab_size=VOCAB))
    FACTORY.forward(fresh_model, make_input(prefill, vocab_size=VOCAB))
    decode = [(1, [12], 4), (3, [13, 14], 3, 1)]
    stale = make_input(decode, vocab_size=VOCAB, stale_last=True)
    with pytest.raises(StaleHostTokensError):
        stale.host_tokens.ids  # noqa: B018 - the host really holds placeholders here
    got = FACTORY.forward(model, stale)
    expected = FACTORY.forward(fresh_model, make_input(decode, vocab_size=VOCAB))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_out_of_vocab_ids_are_refused_not_clamped(make_input):
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(1)
    with pytest.raises(EmbeddedBadIdsError):
        FACTORY.forward(model, make_input([(0, [5, VOCAB])], vocab_size=VOCAB + 1, device_ids=True))


def test_bad_slots_and_lengths_are_refused(make_input):
    from tokenstate.contracts import ConfigError, ContractViolation

    model = FACTORY.build_preset("tiny-llama")
    with pytest.raises(ConfigError, match="allocate_slots"):
        FACTORY.forward(model, make_input([(0, [5])], vocab_size=VOCAB))
    model.allocate_slots(2)
    with pytest.raises(ContractViolation, match="outside the 2 allocated slots"):
        FACTORY.forward(model, make_input([(2, [5])], vocab_size=VOCAB))
    with pytest.raises(ConfigError, match="max_model_len"):
        FACTORY.forward(model, make_input([(0, [5], model.max_model_len)], vocab_size=VOCAB))
    with pytest.raises(ConfigError, match="num_slots"):
        model.allocate_slots(0)
