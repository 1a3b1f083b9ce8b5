"""post_update and verify_drafts: decode, speculative rows, discarded chunks, refusals."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest
import torch

from tokenstate.contracts import ContractViolation, checks_mode
from tokenstate.runtime.kernels import post_update, verify_drafts


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_decode_rows_scatter_into_their_slots_and_advance_by_one() -> None:
    last, computed = i32(0, 0, 0, 0), i32(10, 20, 30, 40)
    post_update(
        sampled=torch.tensor([7, 8, 9]), cu_num_logits=i32(0, 1, 2, 3), num_sampled=i32(1, 1, 1),
        keep=torch.tensor([True, True, True]), query_start_loc=i32(0, 1, 2, 3),
        num_drafts=i32(0, 0, 0), slots=i32(3, 0, 2), last_sampled=last, num_computed=computed,
    )  # fmt: skip
    assert last.tolist() == [8, 0, 9, 7]
    assert computed.tolist() == [11, 20, 31, 41]


def test_speculative_row_keeps_the_token_after_its_accepted_drafts() -> None:
    # One row, query = last sampled + 3 drafts, 4 logits; 2 drafts accepted → 3 tokens emitted.
    last, computed = i32(5), i32(100)
    post_update(
        sampled=torch.tensor([11, 12, 13, 14]), cu_num_logits=i32(0, 4), num_sampled=i32(3),
        keep=torch.tensor([True]), query_start_loc=i32(0, 4), num_drafts=i32(3), slots=i32(0),
        last_sampled=last, num_computed=computed,
    )  # fmt: skip
    assert last.tolist() == [13]
    assert computed.tolist() == [103]  # the sampled input + 2 accepted drafts; the rejected one not


def test_discarded_prefill_chunk_advances_by_its_query_and_keeps_last_sampled() -> None:
    last, computed = i32(5, 6), i32(0, 8)
    post_update(
        sampled=torch.tensor([42, 43]), cu_num_logits=i32(0, 1, 2), num_sampled=i32(1, 1),
        keep=torch.tensor([False, True]), query_start_loc=i32(0, 4, 5), num_drafts=i32(0, 0),
        slots=i32(0, 1), last_sampled=last, num_computed=computed,
    )  # fmt: skip
    assert last.tolist() == [5, 43]
    assert computed.tolist() == [4, 9]


def test_step_with_no_logits_only_advances_counters() -> None:
    last, computed = i32(5, 6), i32(1, 2)
    post_update(
        sampled=torch.zeros(0, dtype=torch.int64), cu_num_logits=i32(0, 0), num_sampled=i32(0),
        keep=torch.tensor([False]), query_start_loc=i32(0, 3), num_drafts=i32(0), slots=i32(1),
        last_sampled=last, num_computed=computed,
    )  # fmt: skip
    assert (last.tolist(), computed.tolist()) == ([5, 6], [1, 5])


def test_verify_drafts_accepts_the_longest_matching_prefix() -> None:
    draft_table = torch.tensor(
        [[4, 5, 6], [4, 5, 6], [7, 8, 9], [1, 1, 1], [0, 0, 0]], dtype=torch.int32
    )
    # Rows: all 3 match | first mismatches | 2nd mismatches (3rd would match) | no drafts | no logits.
    target = torch.tensor([4, 5, 6, 99, 1, 5, 6, 7, 7, 0, 9, 3])
    num_sampled = verify_drafts(
        target, cu_num_logits=i32(0, 4, 8, 11, 12, 12), slots=i32(0, 1, 2, 3, 4),
        draft_tokens=draft_table, num_drafts=i32(3, 3, 2, 0, 0),
    )  # fmt: skip
    # Row 2 has 2 drafts and 3 logits: [7, 0 | 9]: 7 matches, 8 != 0 → one accepted.
    assert num_sampled.tolist() == [4, 1, 2, 1, 0]
    assert num_sampled.dtype == torch.int32


def test_verify_drafts_without_a_draft_table_samples_one_per_row_with_logits() -> None:
    num_sampled = verify_drafts(
        torch.tensor([3, 4]), cu_num_logits=i32(0, 1, 1, 2), slots=i32(0, 1, 2),
        draft_tokens=torch.zeros(3, 0, dtype=torch.int32), num_drafts=i32(0, 0, 0),
    )  # fmt: skip
    assert num_sampled.tolist() == [1, 0, 1]


def test_verify_then_post_update_for_a_speculative_step() -> None:
    drafts = torch.tensor([[20, 21]], dtype=torch.int32)
    target = torch.tensor([20, 99, 22])  # draft 0 accepted, draft 1 rejected; 99 is the correction
    args = {"cu_num_logits": i32(0, 3), "slots": i32(0), "num_drafts": i32(2)}
    num_sampled = verify_drafts(target, draft_tokens=drafts, **args)
    last, computed = i32(0), i32(7)
    post_update(
        target, num_sampled=num_sampled, keep=torch.tensor([True]), query_start_loc=i32(0, 3),
        last_sampled=last, num_computed=computed, **args,
    )  # fmt: skip
    assert (num_sampled.tolist(), last.tolist(), computed.tolist()) == ([2], [99], [9])


def _reference_post_update(case: Any) -> tuple[list[int], list[int]]:
    last, computed = case.last_sampled.tolist(), case.num_computed.tolist()
    qsl, cu = case.query_start_loc.tolist(), case.cu_num_logits.tolist()
    for r, slot in enumerate(case.slots.tolist()):
        query, drafts, emitted = (
            qsl[r + 1] - qsl[r],
            int(case.num_drafts[r]),
            int(case.num_sampled[r]),
        )
        if bool(case.keep[r]):
            last[slot] = int(case.sampled[cu[r] + emitted - 1])
            computed[slot] += query - drafts + emitted - 1
        else:
            computed[slot] += query - drafts
    return last, computed


def _reference_verify(case: Any, target: torch.Tensor) -> list[int]:
    cu = case.cu_num_logits.tolist()
    out = []
    for r, slot in enumerate(case.slots.tolist()):
        if cu[r + 1] == cu[r]:
            out.append(0)
            continue
        accepted = 0
        while accepted < int(case.num_drafts[r]) and int(case.draft_tokens[slot, accepted]) == int(
            target[cu[r] + accepted]
        ):
            accepted += 1
        out.append(1 + accepted)
    return out


def test_twins_match_row_by_row_references_on_random_steps(cases: ModuleType) -> None:
    rng = random.Random(31)
    for i in range(150):
        case = cases.random_post_update_case(rng)
        args = case.args()
        post_update(*args)
        assert (args[7].tolist(), args[8].tolist()) == _reference_post_update(case), f"case {i}"
        target = case.sampled.remainder(3)
        got = verify_drafts(
            target, case.cu_num_logits, case.slots, case.draft_tokens, case.num_drafts
        )
        assert got.tolist() == _reference_verify(case, target), f"case {i}"


def test_unvalidated_launch_has_the_validated_effect(cases: ModuleType) -> None:
    rng = random.Random(32)
    for i in range(60):
        case = cases.random_post_update_case(rng)
        for backend in ("auto", "torch"):
            checked, unchecked = case.args(), case.args()
            post_update(*checked, backend=backend)
            post_update(*unchecked, backend=backend, validate=False)
            assert torch.equal(checked[7], unchecked[7]), f"case {i}: last_sampled"
            assert torch.equal(checked[8], unchecked[8]), f"case {i}: num_computed"


# --- refusals -------------------------------------------------------------------------------


@pytest.fixture
def good_args() -> list[Any]:
    return [
        torch.tensor([7, 8]), i32(0, 1, 2), i32(1, 1), torch.tensor([True, True]), i32(0, 1, 2),
        i32(0, 0), i32(1, 0), i32(0, 0, 0), i32(5, 5, 5),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (
            0,
            torch.tensor([7.0, 8.0]),
            r"post_update: sampled must be torch.int32 or torch.int64, got torch.float32",
        ),
        (3, i32(1, 1), r"post_update: keep must be torch.bool, got torch.int32"),
        (8, i32(5, 5), r"post_update: num_computed must have shape \[3\], got torch.int32 \(2,\)"),
        (1, i32(0, 1), r"post_update: cu_num_logits must have shape \[3\]"),
        (
            7,
            torch.zeros(3, dtype=torch.int32, device="meta"),
            r"sampled is on cpu but last_sampled is on meta",
        ),
    ],
)
def test_bad_arguments_are_refused(
    good_args: list[Any], index: int, value: torch.Tensor, message: str
) -> None:
    good_args[index] = value
    with pytest.raises(ContractViolation, match=message):
        post_update(*good_args)


def test_full_checks_mode_refuses_a_kept_row_sampling_more_than_its_logits(
    good_args: list[Any],
) -> None:
    good_args[2] = i32(1, 2)
    with (
        checks_mode("full"),
        pytest.raises(ContractViolation, match=r"kept rows \[1\] have num_sampled \[2\] outside"),
    ):
        post_update(*good_args)


def test_verify_drafts_refuses_a_row_indexed_draft_table() -> None:
    with pytest.raises(
        ContractViolation, match=r"verify_drafts: draft_tokens must have shape \[\*, \*\]"
    ):
        verify_drafts(torch.tensor([1]), i32(0, 1), i32(0), i32(4), i32(0))
