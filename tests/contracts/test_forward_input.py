from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tokenstate.contracts import (
    BatchLayout,
    ContractViolation,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    IndexPlan,
    StaleHostTokensError,
    StepIndices,
)

from .conftest import i32


def test_valid_input_exposes_rows_and_embedding_ids(step):
    inp = step.forward_input()
    assert inp.num_tokens == 6 and inp.num_logits == 3 and inp.has_stale_rows
    assert [(r.slot, r.start, r.end, r.num_computed, r.seq_len) for r in inp.layout.rows] == [
        (4, 0, 3, 0, 3),
        (0, 3, 4, 9, 10),
        (2, 4, 6, 5, 7),
    ]
    assert inp.embedding_ids().tolist() == step.real_ids.tolist()


def test_device_tokens_required_iff_a_row_is_stale(step):
    with pytest.raises(ContractViolation, match=r"rows \[1\] are stale on the host, so device_tokens is required"):
        step.forward_input(with_device=False)
    fresh = HostTokens.fresh(step.real_ids, step.qsl, step.slots)
    inp = dataclasses.replace(step.forward_input(), host_tokens=fresh, device_tokens=None)
    assert inp.embedding_ids().tolist() == step.real_ids.tolist()


def test_missing_and_refused_device_tokens_name_from_combine(step):
    """An engine of one's own has no runtime combine step to be sent to: both refusals name the
    constructor to call (DeviceTokens.from_combine), not a forward's fix."""
    with pytest.raises(ContractViolation, match=r"DeviceTokens\.from_combine\(ids, vocab_size=\.\.\.\)"):
        step.forward_input(with_device=False)
    stale = step.forward_input().host_tokens
    with pytest.raises(StaleHostTokensError, match=r"from_host\).*rows \[1\].*DeviceTokens\.from_combine") as info:
        DeviceTokens.from_host(stale, "cpu", vocab_size=64)
    assert "in the forward" not in str(info.value)


def test_forward_input_is_frozen(step):
    inp = step.forward_input()
    with pytest.raises(dataclasses.FrozenInstanceError):
        inp.positions = torch.zeros(6)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("positions", torch.zeros(5, dtype=torch.long), r"positions: expected shape \(6,\)"),
        ("positions", torch.zeros(6), "positions must be an int32/int64 tensor, got torch.float32"),
        ("logits_indices", torch.tensor([0, 1]), r"logits_indices: expected shape \(3,\)"),
        ("slots", torch.tensor([0]), r"slots: expected shape \(3,\)"),
        ("host_tokens", "ids", "host_tokens must be HostTokens, got str"),
        ("device_tokens", torch.zeros(6), "device_tokens must be DeviceTokens or None, got Tensor"),
        ("layout", object(), "layout must be BatchLayout"),
    ],
)
def test_forward_input_invariants(step, field, value, message):
    with pytest.raises(ContractViolation, match=message):
        dataclasses.replace(step.forward_input(), **{field: value})


def test_layout_and_tokens_must_agree(step):
    other = HostTokens.fresh(i32([1, 2]), i32([0, 2]), i32([0]))
    with pytest.raises(ContractViolation, match="layout has 6 tokens in 3 rows but host_tokens has 2 tokens in 1 rows"):
        dataclasses.replace(step.forward_input(), host_tokens=other, device_tokens=None)


def test_device_tokens_must_match_positions(step):
    from tokenstate.contracts import DeviceTokens

    short = DeviceTokens.from_combine(i32([1, 2]), vocab_size=11)
    with pytest.raises(ContractViolation, match=r"device_tokens are \[2\] on cpu; expected \[6\] on cpu"):
        dataclasses.replace(step.forward_input(), device_tokens=short)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slots": i32([0, 0, 1])}, "slots must be distinct"),
        ({"seq_lens": i32([2, 10, 7])}, "row 0: seq_len=2, query_len=3"),
        ({"num_drafts": i32([0, 1, 0])}, "need seq_len >= query_len and 0 <= num_drafts < query_len"),
        ({"logits_indices": torch.tensor([6])}, r"logits_indices must lie in \[0, num_tokens=6\)"),
        ({"query_start_loc": i32([0, 3, 2, 6])}, "query_start_loc must rise from 0"),
        ({"seq_lens": torch.tensor([3.0, 10.0, 7.0])}, "seq_lens: expected a 1-D int32/int64 CPU tensor"),
        ({"slots": i32([4, 0])}, r"query_start_loc: expected shape \(3,\)"),
    ],
)
def test_batch_layout_invariants(step, kwargs, message):
    args = {
        "query_start_loc": step.qsl,
        "seq_lens": step.seq_lens,
        "slots": step.slots,
        "num_drafts": step.num_drafts,
        "logits_indices": torch.tensor([2, 3, 5]),
    } | kwargs
    with pytest.raises(ContractViolation, match=message):
        BatchLayout(**args)


def test_forward_input_refuses_device_logits_indices_past_num_tokens():
    inp = _metadata_input()
    with pytest.raises(ContractViolation, match=r"logits_indices must lie in \[0, num_tokens=3\)"):
        dataclasses.replace(inp, logits_indices=torch.tensor([0, 3]))
    with pytest.raises(ContractViolation, match=r"logits_indices must lie in \[0, num_tokens=3\)"):
        dataclasses.replace(inp, logits_indices=torch.tensor([-1, 2]))


def test_forward_input_carries_the_metadata_forwards_need():
    inp = _metadata_input()
    assert (inp.num_tokens, inp.num_rows, inp.num_logits) == (3, 2, 2)
    assert inp.logit_rows.tolist() == [0, 1]
    assert inp.layout.logit_slots.tolist() == [7, 4]
    assert inp.layout.query_lens.tolist() == [2, 1]


def _metadata_input() -> ForwardInput:
    """Two rows (slots 7 and 4): a 2-token prefill chunk and a fresh decode row, logits at 1 and 2."""
    qsl, seq, slots = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([2, 6], dtype=torch.int32), torch.tensor([7, 4], dtype=torch.int32)
    host = HostTokens.fresh(torch.tensor([3, 4, 5], dtype=torch.int32), qsl, slots)
    logits = torch.tensor([1, 2])  # [num_logits] int64
    layout = BatchLayout(qsl, seq, slots, torch.zeros(2, dtype=torch.int32), logits)
    return ForwardInput(host, None, torch.tensor([0, 1, 5]), layout, logits.clone(), slots.long())


def test_layout_carries_the_step_indices_it_is_given():
    layout = _metadata_input().layout
    assert layout.indices is None  # a layout built by hand: the forward plans its own
    plan = IndexPlan((np.array([2, 0], dtype=np.int64),), meta="part")
    indices = StepIndices(plan.meta, (torch.tensor([2, 0]),))
    carried = layout.with_indices(indices)
    assert carried.indices is indices and layout.indices is None  # a new layout, the old unchanged
    assert carried.rows == layout.rows and carried.slots is layout.slots


def test_index_plans_refuse_what_the_staging_cannot_carry():
    with pytest.raises(ContractViolation, match=r"arrays\[0\].*1-D int64.*dtype=np.int64"):
        IndexPlan((np.array([1, 2], dtype=np.int32),), meta=None)
    plan = IndexPlan((np.array([1, 2], dtype=np.int64),), meta=None)
    with pytest.raises(ContractViolation, match="expected StepIndices"):
        _metadata_input().layout.with_indices(plan)  # type: ignore[arg-type]
