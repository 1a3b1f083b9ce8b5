"""Rolling back recurrent state past rejected speculative drafts: a checkpoint per draft position.

A KV cache rolls back for free (a rejected draft's K/V lie beyond the slot's length and are
overwritten later), but a recurrent layer (Mamba2's conv + SSM state, KDA's conv + delta-rule
state) has folded every fed token into one state. So a row that carries drafts saves the layer's
state after *each* of its positions, and the slot's next row restores the one after the last
accepted position, before it runs.

Which one is known on the host without a device sync: verification runs on the device, but the
scheduler rolls ``num_computed`` back when the step resolves, and a request with drafts in flight
is not scheduled again before that. So the slot's next row starts at ``base + 1 + accepted`` (``base``
being the draft row's first position), and the checkpoint to restore is the one after position
``num_computed - 1`` — an index the host reads off the next row's layout.

A slot reseeded for a new owner (admission after a finish or a preemption) forgets its pending
checkpoints — the new owner's first row must never restore the old owner's state. The tracker is
host bookkeeping: the runtime plans a step's rollback on the host (:meth:`DraftTracker.plan_part`,
from the model's ``plan_indices``) and its index arrays travel in the step's one upload, so a new
owner is recognised there, by its first row starting at position 0 (every admission prefills from
the start); ``reset`` (called by ``model.reset_slot``) forgets a slot's checkpoints too, for code
that drives a model without the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from torch import Tensor

from tokenstate.contracts import BatchLayout, ContractViolation, ForwardInput, RowSpan
from tokenstate.models.step_plan import PlanPart, part_tensors, upload_part

__all__ = [
    "NO_DRAFTS",
    "PART",
    "DraftGroup",
    "DraftPlan",
    "DraftTracker",
    "StateCheckpoints",
    "bind_draft_plan",
]

PART = "drafts"
"""The name of the draft rollback's part of a model's index plan."""


@dataclass(frozen=True, slots=True)
class DraftGroup:
    """This step's rows that carry drafts and have the same query length ``length``."""

    length: int
    slots: Tensor  # [G] int64, execution device
    starts: Tensor  # [G] int64, execution device: flat index of each row's first token

    def tokens(self, position: int) -> Tensor:
        """``[G]`` flat token index of each row's ``position``-th query token."""
        return self.starts + position


@dataclass(frozen=True, slots=True)
class DraftPlan:
    """One step's rollback work for every recurrent layer.

    Attributes:
        restore_slots: ``[R]`` int64 (execution device): slots whose previous row carried drafts.
        restore_index: ``[R]`` int64: the checkpoint (position within that row) to restore.
        groups: this step's rows that carry drafts, by query length: the layer advances them one
            position at a time and saves its state after each.
    """

    restore_slots: Tensor | None
    restore_index: Tensor | None
    groups: tuple[DraftGroup, ...]


NO_DRAFTS: Final = DraftPlan(None, None, ())
"""A step without draft rows or restores."""


class DraftTracker:
    """Host bookkeeping: which slots hold checkpoints that their next row must resolve.

    Only the host's planning (:meth:`plan_part`, in step order) reads and writes it — never a task
    on the stream, which may run behind the host. A slot's new owner needs no reset: its first row
    starts at position 0, which voids the previous owner's pending checkpoint."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, int]] = {}  # slot -> (draft row's num_computed, query_len)

    def plan_part(self, layout: BatchLayout) -> PlanPart:
        """On the host, before the step is launched: its rollback work as index arrays.

        Consumes the pending checkpoints of the step's slots and records the step's own draft
        rows, so it is called once per step, in step order.
        """
        slots: list[int] = []
        index: list[int] = []
        for row in layout.rows:
            pending = self._pending.pop(row.slot, None)
            if pending is None or row.num_computed == 0:  # a new owner's first row: nothing to restore
                continue
            base, count = pending
            position = row.num_computed - base - 1  # the last accepted position of the draft row
            if not 0 <= position < count:
                raise ContractViolation(
                    f"slot {row.slot}: its previous row carried drafts over positions "
                    f"[{base}, {base + count}), but this row (row {row.row}) starts at "
                    f"{row.num_computed}, which no accepted-draft count explains. The runner must "
                    "reset the slot (model.reset_slot) when it gets a new owner, and schedule a "
                    "request's next row only once its drafts were verified."
                )
            slots.append(row.slot)
            index.append(position)
        by_length: dict[int, list[RowSpan]] = {}
        for row in layout.rows:
            if row.num_drafts > 0:
                by_length.setdefault(row.query_len, []).append(row)
                self._pending[row.slot] = (row.num_computed, row.query_len)
        host = [slots, index] if slots else []
        for rows in by_length.values():
            host += [[r.slot for r in rows], [r.start for r in rows]]
        arrays = tuple(np.array(h, dtype=np.int64) for h in host)
        return PlanPart(_DraftMeta(restores=bool(slots), lengths=tuple(by_length)), arrays)

    def plan(self, inp: ForwardInput) -> DraftPlan:
        """On the stream: the step's rollback work, from the indices the runtime uploaded with it
        (part ``"drafts"`` of ``inp.layout.indices``); planned and uploaded here only for a forward
        called without the runtime."""
        found = part_tensors(inp, PART)
        if found is None:
            part = self.plan_part(inp.layout)
            found = part.meta, upload_part(part.arrays, inp.device)
        return bind_draft_plan(*found)

    def clear(self) -> None:
        self._pending.clear()


def bind_draft_plan(meta: object, tensors: tuple[Tensor, ...]) -> DraftPlan:
    """On the stream: the :class:`DraftPlan` over a ``"drafts"`` part's uploaded tensors (views)."""
    if not isinstance(meta, _DraftMeta):
        raise ContractViolation(f"index plan part {PART!r} was not built by DraftTracker.plan_part.")
    if not tensors:
        return NO_DRAFTS
    parts = list(tensors)
    restore_slots = restore_index = None
    if meta.restores:
        restore_slots, restore_index, parts = parts[0], parts[1], parts[2:]
    groups = tuple(
        DraftGroup(length, parts[2 * g], parts[2 * g + 1]) for g, length in enumerate(meta.lengths)
    )
    return DraftPlan(restore_slots, restore_index, groups)


@dataclass(frozen=True, slots=True)
class _DraftMeta:
    """The host-only part of a step's draft plan: which index arrays were sent."""

    restores: bool  # the first two arrays are the restore slots and checkpoint indices
    lengths: tuple[int, ...]  # query length of each draft group, in array order (two arrays each)


class StateCheckpoints:
    """One layer's saved states: ``[num_slots, positions, *state]`` per state tensor, grown on use."""

    def __init__(self) -> None:
        self._buffers: list[Tensor] = []

    def save(self, position: int, slots: Tensor, states: Sequence[Tensor]) -> None:
        """Save ``state[slots]`` of every state tensor as the checkpoint after ``position``."""
        if not self._buffers or self._buffers[0].shape[1] <= position:
            self._grow(position + 1, states)
        for buffer, state in zip(self._buffers, states, strict=True):
            buffer[slots, position] = state[slots]

    def restore(self, plan: DraftPlan, states: Sequence[Tensor]) -> None:
        """Put back the checkpoints ``plan`` names (the states after each slot's last accepted draft)."""
        if plan.restore_slots is None or plan.restore_index is None:
            return
        if not self._buffers:
            raise ContractViolation(
                "a restore was planned for a layer that saved no checkpoint; every recurrent layer "
                "must save its state after each draft position (StateCheckpoints.save)."
            )
        for buffer, state in zip(self._buffers, states, strict=True):
            state[plan.restore_slots] = buffer[plan.restore_slots, plan.restore_index]

    def _grow(self, positions: int, states: Sequence[Tensor]) -> None:
        old = self._buffers
        self._buffers = [
            state.new_zeros((state.shape[0], positions, *state.shape[1:])) for state in states
        ]  # [num_slots, positions, *state] each
        for new, previous in zip(self._buffers, old, strict=False):
            new[:, : previous.shape[1]] = previous

    def clear(self) -> None:
        self._buffers = []
