"""guarded_embedding, GuardedEmbedding and StepGuard: refuse, record, raise at the sync point."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from tokenstate.contracts import PLACEHOLDER, BatchLayout, ConfigError, ContractViolation
from tokenstate.runtime.kernels import (
    EmbeddedBadIdsError,
    GuardedEmbedding,
    StepGuard,
    current_guard,
    guarded_embedding,
    guarded_embedding_twin,
)

VOCAB, HIDDEN = 10, 4


@pytest.fixture
def weight() -> torch.Tensor:
    return torch.arange(VOCAB * HIDDEN, dtype=torch.float32).view(VOCAB, HIDDEN) + 1.0


def layout_of(query_lens: list[int], slots: list[int]) -> BatchLayout:
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    return BatchLayout(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor([q + 10 for q in query_lens], dtype=torch.int32),
        slots=torch.tensor(slots, dtype=torch.int32),
        num_drafts=torch.zeros(len(slots), dtype=torch.int32),
        logits_indices=torch.tensor([e - 1 for e in qsl[1:]], dtype=torch.int64),
    )


def test_good_ids_gather_rows_bad_ids_give_zero_rows_and_flags(weight: torch.Tensor) -> None:
    ids = torch.tensor([3, PLACEHOLDER, 9, VOCAB, 0], dtype=torch.int32)
    rows, bad = guarded_embedding_twin(ids, weight)
    assert bad.tolist() == [False, True, False, True, False]
    assert torch.equal(rows[[0, 2, 4]], weight[[3, 9, 0]])
    assert torch.count_nonzero(rows[[1, 3]]) == 0  # zeroed, not row 0 or row vocab-1 (no clamp)


def test_any_id_shape_embeds_to_that_shape_plus_hidden(weight: torch.Tensor) -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = guarded_embedding(ids, weight)
    assert out.shape == (2, 3, HIDDEN)
    assert torch.equal(out, weight[ids])


def test_outside_a_guard_bad_ids_raise_at_once_with_positions_and_ids(weight: torch.Tensor) -> None:
    ids = torch.tensor([1, PLACEHOLDER, 2, 12], dtype=torch.int64)
    with pytest.raises(EmbeddedBadIdsError) as info:
        guarded_embedding(ids, weight)
    assert info.value.positions == (1, 3)
    assert info.value.ids == (PLACEHOLDER, 12)
    message = str(info.value)
    assert "outside [0, vocab=10)" in message
    assert "flat positions [1, 3]" in message
    assert "1 of them PLACEHOLDER=-1" in message
    assert "read inp.device_tokens.ids" in message
    assert isinstance(info.value, ContractViolation)


def test_inside_a_guard_flags_are_recorded_then_raised_naming_rows_and_slots(
    weight: torch.Tensor,
) -> None:
    layout = layout_of(query_lens=[3, 1, 1], slots=[4, 7, 2])
    ids = torch.tensor([5, 6, 7, PLACEHOLDER, 1], dtype=torch.int32)  # row 1 embeds its placeholder
    guard = StepGuard()
    with guard:
        out = guarded_embedding(ids, weight)  # no raise, no host sync inside the step
    assert guard.num_pending == 1
    assert torch.count_nonzero(out[3]) == 0
    with pytest.raises(EmbeddedBadIdsError) as info:
        guard.raise_if_violated(layout)
    assert (info.value.rows, info.value.slots, info.value.positions) == ((1,), (7,), (3,))
    assert "rows [1] (slots [7]), flat positions [3]" in str(info.value)
    guard.raise_if_violated(layout)  # records were consumed: the guard is ready for the next step
    assert guard.num_pending == 0


def test_a_clean_step_passes_the_sync_point(weight: torch.Tensor) -> None:
    with StepGuard() as guard:
        guarded_embedding(torch.tensor([0, 9]), weight)
        guarded_embedding(torch.tensor([4]), weight)
    assert guard.num_pending == 2
    guard.raise_if_violated(layout_of([2], [0]))
    assert guard.num_pending == 0


def test_the_offending_embedding_among_several_is_reported(weight: torch.Tensor) -> None:
    with StepGuard() as guard:
        guarded_embedding(torch.tensor([0, 1]), weight)
        guarded_embedding(torch.tensor([2, -5]), weight)
    with pytest.raises(EmbeddedBadIdsError, match=r"ids \[-5\] \(0 of them PLACEHOLDER"):
        guard.raise_if_violated()


def test_ids_are_reported_as_embedded_even_if_the_buffer_is_reused(weight: torch.Tensor) -> None:
    ids = torch.tensor([PLACEHOLDER, 3])
    with StepGuard() as guard:
        guarded_embedding(ids, weight)
    ids.fill_(1)  # the runner reuses its input buffer before the sync point
    with pytest.raises(EmbeddedBadIdsError) as info:
        guard.raise_if_violated()
    assert info.value.ids == (PLACEHOLDER,)


def test_layout_that_does_not_match_the_embedding_is_said_so(weight: torch.Tensor) -> None:
    with StepGuard() as guard:
        guarded_embedding(torch.tensor([PLACEHOLDER]), weight)
    with pytest.raises(EmbeddedBadIdsError, match=r"the layout has 2 tokens, the embedding saw 1"):
        guard.raise_if_violated(layout_of([2], [0]))


def test_guards_are_context_local_and_nest(weight: torch.Tensor) -> None:
    outer = StepGuard()
    seen_in_thread: list[object] = []

    def other_thread() -> None:
        seen_in_thread.append(current_guard())
        try:
            guarded_embedding(torch.tensor([PLACEHOLDER]), weight)
        except EmbeddedBadIdsError as exc:  # no guard here: raised at once
            seen_in_thread.append(exc.positions)

    with outer:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        with StepGuard() as inner:
            assert current_guard() is inner
            guarded_embedding(torch.tensor([1]), weight)
        assert current_guard() is outer
    assert current_guard() is None
    assert seen_in_thread == [None, (0,)]
    assert (outer.num_pending, inner.num_pending) == (0, 1)


def test_entering_an_active_guard_twice_is_refused() -> None:
    guard = StepGuard()
    with guard, pytest.raises(ContractViolation, match=r"StepGuard is already active"), guard:
        pass


def test_gradients_reach_only_the_rows_of_good_ids(weight: torch.Tensor) -> None:
    weight.requires_grad_(True)
    with StepGuard() as guard:
        out = guarded_embedding(torch.tensor([2, PLACEHOLDER]), weight)
    out.sum().backward()
    assert weight.grad is not None
    assert weight.grad[2].tolist() == [1.0] * HIDDEN
    assert torch.count_nonzero(weight.grad) == HIDDEN
    with pytest.raises(EmbeddedBadIdsError):
        guard.raise_if_violated()


@pytest.mark.parametrize(
    ("ids", "weight_arg", "message"),
    [
        (
            torch.tensor([1.0]),
            None,
            r"guarded_embedding: ids must be int32 or int64 token ids, got torch.float32",
        ),
        (
            torch.tensor([1]),
            torch.ones(4, 3, dtype=torch.int32),
            r"weight must be torch.float32 or .* got torch.int32",
        ),
        (torch.tensor([1]), torch.ones(3, 4).t(), r"weight must be contiguous"),
        (
            torch.tensor([1]),
            torch.ones(4),
            r"weight must have shape \[\*, \*\], got torch.float32 \(4,\)",
        ),
        (torch.tensor([1]), torch.ones(0, 4), r"weight has an empty vocabulary"),
        (torch.tensor([1], device="meta"), None, r"ids is on meta but weight is on cpu"),
        ([1, 2], None, r"ids must be a torch.Tensor, got list"),
    ],
)
def test_bad_arguments_are_refused(
    weight: torch.Tensor, ids: object, weight_arg: torch.Tensor | None, message: str
) -> None:
    with pytest.raises(ContractViolation, match=message):
        guarded_embedding(ids, weight if weight_arg is None else weight_arg)  # type: ignore[arg-type]


def test_guarded_embedding_module_is_a_drop_in_for_nn_embedding() -> None:
    torch.manual_seed(0)
    plain = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
    guarded = GuardedEmbedding(VOCAB, HIDDEN, padding_idx=0)
    assert isinstance(guarded, nn.Embedding)
    assert list(guarded.state_dict()) == list(plain.state_dict()) == ["weight"]
    guarded.load_state_dict(plain.state_dict())
    ids = torch.tensor([[0, 3, 9]])
    assert torch.equal(guarded(ids), plain(ids))
    with pytest.raises(EmbeddedBadIdsError):
        guarded(torch.tensor([VOCAB]))


def test_from_embedding_shares_the_weight_parameter() -> None:
    plain = nn.Embedding(VOCAB, HIDDEN)
    guarded = GuardedEmbedding.from_embedding(plain)
    assert guarded.weight is plain.weight
    assert torch.equal(guarded(torch.tensor([4])), plain.weight[[4]])


def test_options_that_change_the_forward_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"does not support max_norm"):
        GuardedEmbedding(VOCAB, HIDDEN, max_norm=1.0)
    with pytest.raises(
        ConfigError, match=r"does not support max_norm, scale_grad_by_freq or sparse"
    ):
        GuardedEmbedding.from_embedding(nn.Embedding(VOCAB, HIDDEN, sparse=True))
