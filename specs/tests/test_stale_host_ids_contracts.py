"""Paid items of specs/stale-host-ids.md carried by the type states in tokenstate.contracts."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    ContractViolation,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    StaleHostTokensError,
    stale_position_mask,
)

from .stale_host_ids_mutants import (
    any_stale_blocks_every_row,
    completing_chunk_spliced,
    stale_input_without_device_ids,
    stale_read_allowed,
    stale_upload_allowed,
)

VOCAB = 50


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# One async step, four rows: a prefill chunk (slot 5), a decode row (slot 1), the chunk that
# completes a prefill (slot 3) and a decode row with two draft tokens (slot 0).
QSL = i32([0, 4, 5, 7, 10])  # [num_rows + 1]
SEQ_LENS = i32([4, 12, 9, 15])  # [num_rows]
PREFILL_LENS = i32([8, 11, 9, 12])  # [num_rows], gathered by slot
NUM_DRAFTS = i32([0, 0, 0, 2])  # [num_rows]
SLOTS = i32([5, 1, 3, 0])  # [num_rows]
REAL_IDS = i32([10, 11, 12, 13, 21, 30, 31, 40, 41, 42])  # [num_tokens] what the device holds
EXPECTED_STALE = [False] * 4 + [True] + [False] * 2 + [True] * 3  # decode tails only


def host_tokens() -> HostTokens:
    stale = stale_position_mask(QSL, SEQ_LENS, PREFILL_LENS, NUM_DRAFTS)  # [num_tokens] bool
    ids = torch.where(stale, torch.full_like(REAL_IDS, PLACEHOLDER), REAL_IDS)  # [num_tokens] int32
    return HostTokens(ids, stale, QSL, SLOTS)


def forward_input(device_tokens: DeviceTokens | None) -> ForwardInput:
    logits_indices = torch.tensor([3, 4, 6, 7, 8, 9])  # [num_logits] int64
    return ForwardInput(
        host_tokens=host_tokens(),
        device_tokens=device_tokens,
        positions=torch.tensor([0, 1, 2, 3, 11, 7, 8, 12, 13, 14]),
        layout=BatchLayout(QSL, SEQ_LENS, SLOTS, NUM_DRAFTS, logits_indices),
        logits_indices=logits_indices,
        slots=SLOTS.long(),
    )


@pytest.mark.paid("SHI-1", before=stale_read_allowed)
def test_stale_read_refused():
    with pytest.raises(StaleHostTokensError) as info:
        _ = host_tokens().ids
    err = info.value
    assert (err.rows, err.slots, err.positions) == ((1, 3), (1, 0), (4, 7, 8, 9))
    assert "rows [1, 3] (slots [1, 0])" in str(err) and "honors_device_token_ids" in str(err)


@pytest.mark.paid("SHI-2", before=any_stale_blocks_every_row)
def test_fresh_rows_stay_readable():
    host = host_tokens()
    assert host.row_ids(0).tolist() == [10, 11, 12, 13]
    assert host.row_ids(2).tolist() == [30, 31]
    with pytest.raises(StaleHostTokensError, match=r"rows \[3\] \(slots \[0\]\)"):
        host.row_ids(3)


@pytest.mark.paid("SHI-3", before=stale_upload_allowed)
def test_device_tokens_only_from_combine_or_fresh_upload():
    with pytest.raises(ContractViolation, match="cannot be constructed directly"):
        DeviceTokens(REAL_IDS, VOCAB)
    with pytest.raises(StaleHostTokensError, match=r"rows \[1, 3\]"):
        DeviceTokens.from_host(host_tokens(), "cpu", vocab_size=VOCAB)
    fresh = HostTokens.fresh(REAL_IDS, QSL, SLOTS)
    assert DeviceTokens.from_host(fresh, "cpu", vocab_size=VOCAB).ids.tolist() == REAL_IDS.tolist()


@pytest.mark.paid("SHI-4", before=stale_input_without_device_ids)
def test_forward_input_requires_device_tokens_when_stale():
    with pytest.raises(
        ContractViolation, match=r"rows \[1, 3\] are stale .* device_tokens is required"
    ):
        forward_input(None)
    inp = forward_input(DeviceTokens.from_combine(REAL_IDS.clone(), vocab_size=VOCAB))
    assert inp.embedding_ids().tolist() == REAL_IDS.tolist()


@pytest.mark.paid("SHI-5", before=completing_chunk_spliced)
def test_row_predicate_marks_exactly_the_spliced_tail():
    assert stale_position_mask(QSL, SEQ_LENS, PREFILL_LENS, NUM_DRAFTS).tolist() == EXPECTED_STALE
    # The host buffer of the step holds placeholders exactly there, and nowhere else.
    host = host_tokens().placeholder_buffer()  # [num_tokens] int32
    assert [int(i) == PLACEHOLDER for i in host] == EXPECTED_STALE
