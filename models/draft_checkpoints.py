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
checkpoints: ``reset`` — the new owner's first row must never restore the old owner's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch
from torch import Tensor

from tokenstate.contracts import ContractViolation, ForwardInput, RowSpan

__all__ = ["NO_DRAFTS", "DraftGroup", "DraftPlan", "DraftTracker", "StateCheckpoints"]


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
    """Host bookkeeping: which slots hold checkpoints that their next row must resolve."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, int]] = {}  # slot -> (draft row's num_computed, query_len)

    def plan(self, inp: ForwardInput) -> DraftPlan:
        """The rollback work of one step (host metadata only: no device sync)."""
        slots: list[int] = []
        index: list[int] = []
        for row in inp.layout.rows:
            pending = self._pending.pop(row.slot, None)
            if pending is None:
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
        for row in inp.layout.rows:
            if row.num_drafts > 0:
                by_length.setdefault(row.query_len, []).append(row)
                self._pending[row.slot] = (row.num_computed, row.query_len)
        # One host->device copy for every index vector of the step.
        host = [slots, index] if slots else []
        for rows in by_length.values():
            host += [[r.slot for r in rows], [r.start for r in rows]]
        if not host:
            return NO_DRAFTS
        sizes = [len(h) for h in host]
        packed = torch.tensor([v for h in host for v in h], dtype=torch.int64)  # [sum(sizes)]
        if inp.device.type != "cpu":
            packed = packed.pin_memory().to(inp.device, non_blocking=True)
        parts = list(packed.split(sizes))
        restore_slots = restore_index = None
        if slots:
            restore_slots, restore_index, parts = parts[0], parts[1], parts[2:]
        groups = tuple(
            DraftGroup(length, parts[2 * g], parts[2 * g + 1]) for g, length in enumerate(by_length)
        )
        return DraftPlan(restore_slots, restore_index, groups)

    def reset(self, slot: int) -> None:
        """The slot gets a new owner: its checkpoints are void."""
        self._pending.pop(slot, None)

    def clear(self) -> None:
        self._pending.clear()


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
