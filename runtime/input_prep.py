"""Host-side input preparation: one step's flat token buffer, stale mask and batch metadata.

Everything is built from a per-slot token table with a handful of numpy operations per step, so the
host work does not grow with a Python loop over tokens. On the async path the stale mask comes from
the one row predicate (:func:`tokenstate.contracts.stale_position_mask`) and the host buffer holds
``PLACEHOLDER`` at exactly those positions — a row's speculative draft positions included, since
the drafts are proposed on the device; on the synchronous path every fed token is known (drafts as
the host learnt them at the last sync point), and a placeholder there is a runner bug, refused on
the spot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    ContractViolation,
    HostTokens,
    stale_position_mask,
)
from tokenstate.runtime.scheduler import Request, ScheduledBatch

__all__ = ["HostStepInputs", "HostTokenTable", "prepare_inputs", "refresh_inputs"]


class HostTokenTable:
    """Every token the host knows, by slot and position (``PLACEHOLDER`` where it knows none)."""

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        self.ids = np.full(
            (num_slots, max_model_len), PLACEHOLDER, dtype=np.int32
        )  # [num_slots, max_model_len]

    def admit(self, request: Request) -> None:
        """Seed a slot with what the host knows at admission; wipe the previous occupant's tokens."""
        row = self.ids[request.slot]
        row.fill(PLACEHOLDER)
        known = request.num_known
        row[: len(request.prompt)] = request.prompt
        row[len(request.prompt) : known] = request.output_token_ids

    def record(self, slots: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> None:
        """Write resolved sampled tokens (``[n]`` each) at their positions."""
        self.ids[slots, positions] = tokens


@dataclass(frozen=True, slots=True)
class HostStepInputs:
    """One step's host tensors (CPU; the mirror uploads them) and the type states built from them."""

    host_tokens: HostTokens
    layout: BatchLayout
    positions: np.ndarray  # [num_tokens] int32
    token_slots: np.ndarray  # [num_tokens] int32, slot of each flat token
    query_start_loc: np.ndarray  # [num_rows + 1] int32
    seq_lens: np.ndarray  # [num_rows] int32
    slots: np.ndarray  # [num_rows] int32
    num_drafts: np.ndarray  # [num_rows] int32
    cu_num_logits: np.ndarray  # [num_rows + 1] int32
    logits_indices: np.ndarray  # [num_logits] int32
    # Per logit (a sampling row has 1 + num_drafts of them, in row order):
    sample_slots: np.ndarray  # [num_logits] int32, slot of each sampled token
    sample_positions: np.ndarray  # [num_logits] int32, position each sampled token will occupy
    sample_output_index: np.ndarray  # [num_logits] int32, index of each sampled token in its output
    # The logits whose sampled position holds a draft in this step's input (all but the last logit
    # of a drafted row), and which of the slot's drafts sits there:
    draft_logits: np.ndarray  # [num_draft_logits] int32
    draft_rank: np.ndarray  # [num_draft_logits] int32, index into the slot's draft table

    @property
    def has_stale(self) -> bool:
        return self.host_tokens.has_stale

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def num_logits(self) -> int:
        return self.logits_indices.shape[0]


def _known_ids(
    table: HostTokenTable,
    token_slots: np.ndarray,
    positions: np.ndarray,
    draft_positions: np.ndarray,
    draft_ids: np.ndarray,
) -> np.ndarray:
    ids = table.ids[token_slots, positions]  # [num_tokens] int32
    ids[draft_positions] = draft_ids  # drafts are not part of the sequence: the host learnt them
    if ids.size and int(ids.min()) < 0:
        bad = np.flatnonzero(ids < 0)[:8].tolist()
        raise ContractViolation(
            f"input preparation: flat positions {bad} hold no known token on a step that must run on "
            "fresh host ids; the runner has to resolve the pending sampled tokens before preparing a "
            "synchronous step."
        )
    return ids


def _host_drafts(batch: ScheduledBatch, query_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions of every row's drafts and the drafts the host learnt at the last sync point.

    Only used where the step runs on fresh host ids (sync path, fallback); on the async path the
    drafts are stale positions that combine splices in from the device.
    """
    positions: list[np.ndarray] = []
    ids: list[int] = []
    for r, row in enumerate(batch.rows):
        if row.num_drafts:
            drafts = row.request.host_drafts[: row.num_drafts]
            if len(drafts) != row.num_drafts:
                raise ContractViolation(
                    f"input preparation: row {r} carries {row.num_drafts} drafts but the host "
                    f"learnt {len(drafts)}; resolve the step that proposed them first."
                )
            positions.append(np.arange(query_end[r] - row.num_drafts, query_end[r]))
            ids.extend(drafts)
    flat = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
    return flat, np.array(ids, dtype=np.int32)


def prepare_inputs(
    batch: ScheduledBatch, table: HostTokenTable, *, spliced: bool
) -> HostStepInputs:
    """Build a step's host inputs; ``spliced`` (the async path) marks stale rows by the predicate."""
    rows = batch.rows
    num_rows = len(rows)
    per_row = np.array(
        [(r.request.slot, r.num_computed, r.num_new_tokens, r.request.prefill_len, r.num_logits,
          len(r.request.prompt), r.num_drafts)
         for r in rows],
        dtype=np.int32,
    ).reshape(num_rows, 7)  # fmt: skip
    slots, num_computed, query_lens, prefill_lens, logits_per_row, prompt_lens, num_drafts = per_row.T
    num_drafts = np.ascontiguousarray(num_drafts)  # [num_rows] int32
    query_start_loc = np.zeros(num_rows + 1, dtype=np.int32)  # [num_rows + 1]
    np.add.accumulate(query_lens, out=query_start_loc[1:])  # np.cumsum's wrapper costs 3x
    seq_lens = num_computed + query_lens  # [num_rows] int32
    num_tokens = int(query_start_loc[-1])
    row_of_token = np.repeat(np.arange(num_rows), query_lens)  # [num_tokens]
    positions = (
        np.arange(num_tokens, dtype=np.int32)
        - query_start_loc[row_of_token]
        + num_computed[row_of_token]
    )  # [num_tokens] int32
    token_slots = slots[row_of_token]  # [num_tokens] int32
    qsl_t, seq_t, slots_t = (
        torch.from_numpy(query_start_loc),
        torch.from_numpy(seq_lens),
        torch.from_numpy(np.ascontiguousarray(slots)),
    )

    if spliced:
        # The predicate on the numpy arrays themselves: a torch op would cost more than the mask.
        stale = stale_position_mask(query_start_loc, seq_lens, prefill_lens, num_drafts)  # [num_tokens]
        ids = table.ids[token_slots, positions]  # [num_tokens] int32
        ids[stale] = PLACEHOLDER  # the host buffer holds a placeholder at every spliced position
        host_tokens = HostTokens(torch.from_numpy(ids), torch.from_numpy(stale), qsl_t, slots_t)
    else:
        draft_pos, draft_ids = _host_drafts(batch, query_start_loc[1:])
        ids = _known_ids(table, token_slots, positions, draft_pos, draft_ids)
        host_tokens = HostTokens.fresh(torch.from_numpy(ids), qsl_t, slots_t)

    # Row r's logits are its last n_r positions (1 + drafts for a sampling row, 0 otherwise).
    cu_num_logits = np.zeros(num_rows + 1, dtype=np.int32)  # [num_rows + 1]
    np.add.accumulate(logits_per_row, out=cu_num_logits[1:])
    num_logits = int(cu_num_logits[-1])
    logit_row = np.repeat(np.arange(num_rows), logits_per_row)  # [num_logits]
    logit_rank = np.arange(num_logits, dtype=np.int32) - cu_num_logits[logit_row]  # [num_logits]
    logits_indices = (
        query_start_loc[1:][logit_row] - logits_per_row[logit_row] + logit_rank
    ).astype(np.int32)  # [num_logits] int32
    # The logit at flat position i predicts the token after positions[i].
    sample_positions = positions[logits_indices] + 1  # [num_logits] int32
    # Logit j < d of a row with d drafts samples the position its draft j occupies as an input.
    draft_logits = np.flatnonzero(logit_rank < num_drafts[logit_row]).astype(np.int32)
    layout = BatchLayout(
        qsl_t,
        seq_t,
        slots_t,
        torch.from_numpy(num_drafts),
        torch.from_numpy(logits_indices.astype(np.int64)),
    )
    return HostStepInputs(
        host_tokens=host_tokens,
        layout=layout,
        positions=positions,
        token_slots=token_slots,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        slots=np.ascontiguousarray(slots),
        num_drafts=num_drafts,
        cu_num_logits=cu_num_logits,
        logits_indices=logits_indices,
        sample_slots=slots[logit_row],
        sample_positions=sample_positions.astype(np.int32),
        sample_output_index=(sample_positions - prompt_lens[logit_row]).astype(np.int32),
        draft_logits=draft_logits,
        draft_rank=logit_rank[draft_logits],
    )


def refresh_inputs(
    prepared: HostStepInputs, table: HostTokenTable, batch: ScheduledBatch
) -> HostStepInputs:
    """The same step on fresh host ids (fallback path), after the pending tokens were resolved."""
    draft_pos, draft_ids = _host_drafts(batch, prepared.query_start_loc[1:])
    ids = _known_ids(table, prepared.token_slots, prepared.positions, draft_pos, draft_ids)
    host_tokens = HostTokens.fresh(
        torch.from_numpy(ids), prepared.layout.query_start_loc, prepared.layout.slots
    )
    return dataclasses.replace(prepared, host_tokens=host_tokens)
