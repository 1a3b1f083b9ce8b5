"""Input preparation: host ids, the stale mask from the one predicate, positions and metadata."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    ContractViolation,
    StaleHostTokensError,
    stale_position_mask,
)
from tokenstate.runtime import SamplingParams
from tokenstate.runtime.input_prep import HostTokenTable, prepare_inputs, refresh_inputs
from tokenstate.runtime.scheduler import Request, Scheduler


def _async_decode_step():
    """Request 0 (prompt 4) decodes its in-flight token; request 1 (prompt 6) is mid-prefill."""
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=7, max_model_len=32)
    table = HostTokenTable(2, 32)
    for i, prompt in enumerate(((10, 11, 12, 13), (20, 21, 22, 23, 24, 25))):
        sched.add(Request(i, prompt, SamplingParams(), seed=0, eos_token_ids=()))
    first = sched.schedule()  # request 0 whole (4), request 1 first chunk (3)
    for req in first.admitted:
        table.admit(req)
    return sched, table, first, sched.schedule()


def test_async_step_marks_exactly_the_predicate_positions_with_placeholders():
    _, table, _, second = _async_decode_step()
    step = prepare_inputs(second, table, spliced=True)
    assert step.query_start_loc.tolist() == [0, 1, 4]
    assert step.seq_lens.tolist() == [5, 6] and step.slots.tolist() == [0, 1]
    assert step.positions.tolist() == [4, 3, 4, 5]
    expected_stale = stale_position_mask(
        torch.tensor([0, 1, 4]), torch.tensor([5, 6]), torch.tensor([4, 6])
    )
    assert torch.equal(step.host_tokens.stale, expected_stale)
    assert step.host_tokens.placeholder_buffer().tolist() == [PLACEHOLDER, 23, 24, 25]
    assert step.host_tokens.row_ids(1).tolist() == [23, 24, 25]  # the fresh row stays readable
    with pytest.raises(StaleHostTokensError, match=r"rows \[0\] \(slots \[0\]\)"):
        step.host_tokens.ids  # noqa: B018
    assert step.logits_indices.tolist() == [0, 3] and step.cu_num_logits.tolist() == [0, 1, 2]
    assert step.sample_positions.tolist() == [5, 6] and step.sample_output_index.tolist() == [1, 0]
    assert [(r.slot, r.start, r.end, r.num_computed) for r in step.layout.rows] == [
        (0, 0, 1, 4),
        (1, 1, 4, 3),
    ]


def test_fallback_refresh_needs_the_resolved_token_and_then_is_fresh():
    sched, table, first, second = _async_decode_step()
    step = prepare_inputs(second, table, spliced=True)
    with pytest.raises(ContractViolation, match=r"flat positions \[0\] hold no known token"):
        refresh_inputs(step, table, second)
    sched.update(first, np.array([77], dtype=np.int32))  # request 0's first token resolves
    table.record(np.array([0]), np.array([4]), np.array([77]))  # slot 0, position 4
    fresh = refresh_inputs(step, table, second)
    assert not fresh.has_stale and fresh.host_tokens.ids.tolist() == [77, 23, 24, 25]


def test_sync_step_is_never_stale():
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=32)
    table = HostTokenTable(1, 32)
    sched.add(Request(0, (3, 4, 5), SamplingParams(), seed=0, eos_token_ids=()))
    batch = sched.schedule()
    table.admit(batch.admitted[0])
    step = prepare_inputs(batch, table, spliced=False)
    assert not step.has_stale and step.host_tokens.ids.tolist() == [3, 4, 5]
    assert step.logits_indices.tolist() == [2] and step.sample_output_index.tolist() == [0]


def test_table_admit_wipes_the_previous_occupant():
    table = HostTokenTable(1, 8)
    table.ids[0, :] = 9
    table.admit(Request(0, (1, 2), SamplingParams(), seed=0, eos_token_ids=(), slot=0))
    assert table.ids[0].tolist() == [1, 2] + [PLACEHOLDER] * 6
