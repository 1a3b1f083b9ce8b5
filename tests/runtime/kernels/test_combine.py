"""combine: twin semantics on hand-made batches, agreement with the row predicate, refusals."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest
import torch

from tokenstate.contracts import PLACEHOLDER, ConfigError, ContractViolation, checks_mode
from tokenstate.runtime.kernels import combine

P = PLACEHOLDER


def i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def run(
    host: list[int],
    qsl: list[int],
    seq: list[int],
    slots: list[int],
    drafts: list[int],
    prefill: list[int],
    last: list[int],
    draft_table: list[list[int]] | None,
    cu: list[int],
) -> tuple[list[int], list[int]]:
    table = (
        torch.zeros(len(prefill), 0, dtype=torch.int32)
        if draft_table is None
        else torch.tensor(draft_table, dtype=torch.int32)
    )
    ids, logits = combine(
        i32(*host), i32(*qsl), i32(*seq), i32(*slots), i32(*drafts), i32(*prefill), i32(*last),
        table, i32(*cu),
    )  # fmt: skip
    assert ids.dtype == torch.int32 and logits.dtype == torch.int64
    return ids.tolist(), logits.tolist()


def test_decode_rows_in_shuffled_slot_order_take_their_own_slots_token() -> None:
    # Rows for slots 2, 0, 1: each decode row must read its slot's token, not its row index's.
    ids, logits = run(
        host=[P, P, P], qsl=[0, 1, 2, 3], seq=[8, 5, 9], slots=[2, 0, 1], drafts=[0, 0, 0],
        prefill=[3, 4, 6], last=[100, 101, 102], draft_table=None, cu=[0, 1, 2, 3],
    )  # fmt: skip
    assert ids == [102, 100, 101]
    assert logits == [0, 1, 2]


def test_prefill_chunks_are_copied_and_only_the_completing_chunk_samples() -> None:
    # Slot 0: partial chunk (seq 3 < prefill 6); slot 1: the chunk that completes its prefill
    # (seq == prefill, NOT spliced); slot 2: a decode row (spliced).
    ids, logits = run(
        host=[11, 12, 13, 21, 22, P], qsl=[0, 3, 5, 6], seq=[3, 4, 7], slots=[0, 1, 2],
        drafts=[0, 0, 0], prefill=[6, 4, 5], last=[900, 901, 902], draft_table=None,
        cu=[0, 0, 1, 2],
    )  # fmt: skip
    assert ids == [11, 12, 13, 21, 22, 902]
    assert logits == [4, 5]  # the completing chunk's last position, then the decode row


def test_empty_spliced_row_writes_nothing_and_takes_no_logits() -> None:
    # The middle row is empty but satisfies the predicate: it must not reach into row 0.
    ids, logits = run(
        host=[5, 6, P], qsl=[0, 2, 2, 3], seq=[2, 9, 4], slots=[0, 1, 2], drafts=[0, 0, 0],
        prefill=[2, 1, 1], last=[70, 71, 72], draft_table=None, cu=[0, 1, 1, 2],
    )  # fmt: skip
    assert ids == [5, 6, 72]
    assert logits == [1, 2]


def test_draft_rows_get_last_sampled_then_their_drafts_and_one_plus_d_logits() -> None:
    ids, logits = run(
        host=[P, P, P, P, P], qsl=[0, 1, 4, 5], seq=[10, 12, 6], slots=[1, 0, 2], drafts=[0, 2, 0],
        prefill=[4, 4, 4], last=[50, 51, 52], draft_table=[[60, 61, 62], [70, 71, 72], [80, 81, 82]],
        cu=[0, 1, 4, 5],
    )  # fmt: skip
    # Row 1 (slot 0) has 2 drafts: last sampled, then drafts 0 and 1 (draft 2 is not used).
    assert ids == [51, 50, 60, 61, 52]
    assert logits == [0, 1, 2, 3, 4]


def test_reused_slot_reads_host_ids_until_its_new_request_outgrows_its_prefill() -> None:
    # Slot 0 held an old request whose last sampled token (999) is still in the mirror; the new
    # request was admitted with prefill_len 5. Its prefill chunks must not see 999.
    first_chunk, _ = run(
        host=[1, 2, 3], qsl=[0, 3], seq=[3], slots=[0], drafts=[0], prefill=[5], last=[999],
        draft_table=None, cu=[0, 0],
    )  # fmt: skip
    completing, _ = run(
        host=[4, 5], qsl=[0, 2], seq=[5], slots=[0], drafts=[0], prefill=[5], last=[999],
        draft_table=None, cu=[0, 1],
    )  # fmt: skip
    first_decode, _ = run(
        host=[P], qsl=[0, 1], seq=[6], slots=[0], drafts=[0], prefill=[5], last=[42],
        draft_table=None, cu=[0, 1],
    )  # fmt: skip
    assert (first_chunk, completing, first_decode) == ([1, 2, 3], [4, 5], [42])


def _reference(case: Any) -> tuple[list[int], list[int]]:
    """Row-by-row reference built on the predicate's stale mask."""
    ids = case.host_ids.tolist()
    stale = case.stale().tolist()
    qsl, cu = case.query_start_loc.tolist(), case.cu_num_logits.tolist()
    logits: list[int] = []
    for r, slot in enumerate(case.slots.tolist()):
        end, nd = qsl[r + 1], int(case.num_drafts[r])
        tail = [int(case.last_sampled[slot]), *case.draft_tokens[slot, :nd].tolist()]
        for k, pos in enumerate(range(end - 1 - nd, end)):
            if pos >= qsl[r] and stale[pos]:
                ids[pos] = tail[k]
        n = cu[r + 1] - cu[r]
        logits.extend(range(end - n, end))
    return ids, logits


def test_twin_matches_row_by_row_reference_on_random_batches(cases: ModuleType) -> None:
    rng = random.Random(2024)
    for i in range(120):
        case = cases.random_combine_case(rng)
        ids, logits = combine(*case.args())
        want_ids, want_logits = _reference(case)
        assert ids.tolist() == want_ids, f"case {i}"
        assert logits.tolist() == want_logits, f"case {i}"


def test_twin_replaces_exactly_the_positions_the_predicate_marks_stale(cases: ModuleType) -> None:
    rng = random.Random(77)
    for i in range(120):
        case = cases.random_combine_case(rng)
        case.host_ids.fill_(PLACEHOLDER)
        case.last_sampled.clamp_(min=0)
        ids, _ = combine(*case.args())
        assert torch.equal(ids != PLACEHOLDER, case.stale()), f"case {i}"


def test_num_logits_given_or_read_from_cu_agree(cases: ModuleType) -> None:
    case = cases.random_combine_case(random.Random(3), max_rows=6)
    _, read = combine(*case.args())
    _, given = combine(*case.args(), num_logits=case.num_logits)
    assert torch.equal(read, given)


def test_unvalidated_launch_gives_the_validated_results(cases: ModuleType) -> None:
    rng = random.Random(5)
    for i in range(60):
        case = cases.random_combine_case(rng)
        for backend in ("auto", "torch"):
            want = combine(*case.args(), num_logits=case.num_logits, backend=backend)
            got = combine(*case.args(), num_logits=case.num_logits, backend=backend, validate=False)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"case {i}"


# --- refusals -------------------------------------------------------------------------------


@pytest.fixture
def good_args(cases: ModuleType) -> list[Any]:
    return list(cases.random_combine_case(random.Random(8), max_rows=4, max_drafts=2).args())


NAMES = [
    "host_ids", "query_start_loc", "seq_lens", "slots", "num_drafts", "prefill_len",
    "last_sampled", "draft_tokens", "cu_num_logits",
]  # fmt: skip


@pytest.mark.parametrize("index", range(len(NAMES)))
def test_wrong_dtype_is_refused_naming_the_argument(good_args: list[Any], index: int) -> None:
    good_args[index] = good_args[index].long()
    with pytest.raises(
        ContractViolation, match=rf"combine: {NAMES[index]} must be torch\.int32, got torch\.int64"
    ):
        combine(*good_args)


def test_wrong_size_is_refused_with_expected_and_actual(good_args: list[Any]) -> None:
    num_rows = good_args[2].shape[0]
    good_args[3] = torch.zeros(num_rows + 1, dtype=torch.int32)
    with pytest.raises(
        ContractViolation,
        match=rf"slots must have shape \[{num_rows}\], got torch.int32 \({num_rows + 1},\)",
    ):
        combine(*good_args)


def test_non_contiguous_buffer_is_refused(good_args: list[Any]) -> None:
    table = good_args[7]
    good_args[7] = torch.zeros(table.shape[1], table.shape[0], dtype=torch.int32).t()
    with pytest.raises(
        ContractViolation,
        match=r"draft_tokens must be contiguous, got torch.int32 \(4, 2\) on cpu \(strides \(1, 4\)\)",
    ):
        combine(*good_args)


def test_mixed_devices_are_refused(good_args: list[Any]) -> None:
    good_args[5] = torch.empty(good_args[5].shape, dtype=torch.int32, device="meta")
    with pytest.raises(ContractViolation, match=r"host_ids is on cpu but prefill_len is on meta"):
        combine(*good_args)


def test_non_tensor_is_refused(good_args: list[Any]) -> None:
    good_args[0] = [1, 2, 3]
    with pytest.raises(
        ContractViolation, match=r"combine: host_ids must be a torch.Tensor, got list"
    ):
        combine(*good_args)


def test_negative_num_logits_is_refused(good_args: list[Any]) -> None:
    with pytest.raises(ContractViolation, match=r"num_logits must be >= 0, got -1"):
        combine(*good_args, num_logits=-1)


def test_unknown_backend_is_a_config_error(good_args: list[Any]) -> None:
    with pytest.raises(ConfigError, match=r"backend='cuda' is not one of auto, triton, torch"):
        combine(*good_args, backend="cuda")


def test_triton_on_cpu_without_the_interpreter_is_a_config_error(
    good_args: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=r"needs the Triton interpreter: set TRITON_INTERPRET=1"):
        combine(*good_args, backend="triton")


def test_full_checks_mode_refuses_out_of_range_slots(good_args: list[Any]) -> None:
    num_slots = good_args[5].shape[0]
    good_args[3] = torch.full_like(good_args[3], num_slots)
    with (
        checks_mode("full"),
        pytest.raises(ContractViolation, match=rf"slots values must lie in \[0, {num_slots}\)"),
    ):
        combine(*good_args)


def test_full_checks_mode_refuses_more_drafts_than_the_table_holds(good_args: list[Any]) -> None:
    good_args[4] = torch.full_like(good_args[4], 3)  # the table holds 2 drafts per slot
    with (
        checks_mode("full"),
        pytest.raises(
            ContractViolation, match=r"num_drafts values must lie in \[0, 3\), got min 3"
        ),
    ):
        combine(*good_args)
