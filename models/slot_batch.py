"""Per-step indices every slot-indexed layer reads: which slot and cache position each token is.

Built once per forward from the host-side :class:`~tokenstate.contracts.BatchLayout` (no device
sync: only host metadata is read) and shared by all layers of the step. Rows are split in two:

* **short rows** (decode, decode + drafts: ``query_len <= max_short_query_len``) are attended in
  a few batched, masked attention calls, one per run of consecutive slots, each reading a view of
  the slots' caches in place (no per-step gather of any cache); runs are chosen to read the fewest
  key positions for the calls they take (:data:`RUN_COST_KEYS`);
* **long rows** (prefill chunks) are attended one at a time, each over its own slot's cache.

Index arrays are made on the host with a few numpy operations (:meth:`SlotBatch.plan`, called by the
model's ``plan_indices`` before the step is launched) and travel in the step's one staging upload,
so a forward uploads no row metadata and a CUDA step never waits on the host
(:mod:`tokenstate.models.step_plan`); prefill chunks need no index tensor at all (their K/V are
written as one slice of the slot's cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenstate.contracts import BatchLayout, ConfigError, ContractViolation, ForwardInput
from tokenstate.models.step_plan import PlanPart, part_tensors, upload_part

__all__ = ["RUN_COST_KEYS", "LongRow", "ShortRows", "SlotBatch", "SlotRun"]

DEFAULT_MAX_SHORT_QUERY_LEN = 16
"""Rows with up to this many query tokens join the batched (decode) attention."""
RUN_COST_KEYS = 128
"""What one more attention call costs, in key positions of one slot read (~20 µs of ops around a
call against ~0.1–0.4 µs per key position on this CPU; tuned in the engine: 128 ran tiny workload
B 3 % and big B 3 % faster than 256, tiny workload A the same). A run spanning a hole or padding a
short row to its longest one reads positions for nothing; splitting it costs a call. See ``_slot_runs``."""


@dataclass(frozen=True, slots=True)
class SlotRun:
    """One attention call of the short rows: slots ``[slot_lo, slot_hi)`` read in place.

    The run's keys are the view ``cache[slot_lo:slot_hi, :, :kv_len]`` — no copy. Slots of the run that
    have no row this step (holes) get zero queries whose outputs are never read.
    """

    slot_lo: int
    slot_hi: int
    kv_len: int  # longest seq_len among the run's rows
    offset: int  # the run's first row in the span buffer (runs are laid out one after another)
    key_bias: Tensor | None  # [slot_hi - slot_lo, 1, Q, kv_len] float32, device; None: all keys valid
    # key_bias is additive: 0 where a query may read the key, -inf where it may not (SDPA takes it as
    # it is; a boolean mask would be converted to this in every layer's every call).


@dataclass(frozen=True, slots=True)
class ShortRows:
    """All short rows of a step, padded to a common query length ``Q``, attended per slot run.

    The rows' slots, sorted, are split into runs of consecutive slots: each run is one attention
    call over a view of the caches, so a step never gathers a slot's cache. A run spans holes
    (slots without a row) and pads short rows to its longest where another call would cost more
    (see ``_slot_runs``).
    """

    slots: Tensor  # [R] int64, device
    token_index: Tensor  # [R, Q] int64, device: flat token of each query (padding repeats the last)
    runs: tuple[SlotRun, ...]
    span: int  # rows of the span buffer: sum of the runs' slot counts (>= R)
    span_index: Tensor | None  # [R] int64, device: each row's place in the span; None = 0..R-1
    write_slots: Tensor  # [num_short_tokens] int64, device: slot of each real (unpadded) query token
    write_positions: Tensor  # [num_short_tokens] int64, device: its position in the sequence
    write_tokens: Tensor | None  # [num_short_tokens] int64, device: its flat index; None = 0..T-1
    valid_src: Tensor | None  # [num_short_tokens] int64, device: index into the [R * Q] padded queries
    # valid_src is None when no row is padded (then token_index.view(-1) lists the real tokens).


@dataclass(frozen=True, slots=True)
class LongRow:
    """One prefill chunk: flat tokens ``[start, end)`` at positions ``num_computed .. seq_len-1``."""

    slot: int
    start: int
    end: int
    num_computed: int
    seq_len: int
    key_mask: Tensor | None  # [1, 1, n, seq_len] bool, device; None when num_computed == 0 or on a CPU


@dataclass(frozen=True, slots=True)
class SlotBatch:
    """The short/long row split of one step, with the indices each part reads and writes."""

    short_rows: ShortRows | None
    long_rows: tuple[LongRow, ...]

    def note_writes(self, written: np.ndarray) -> None:
        """Raise ``written`` (``[num_slots]`` int64: one past each slot's last written cache cell)
        to cover this step's writes: a short-row run ``[slot_lo, slot_hi)`` writes below its
        ``kv_len`` (its holes are counted too, harmlessly), a prefill chunk below its ``seq_len``."""
        if self.short_rows is not None:
            for run in self.short_rows.runs:
                span = written[run.slot_lo : run.slot_hi]
                np.maximum(span, run.kv_len, out=span)
        for chunk in self.long_rows:
            written[chunk.slot] = max(int(written[chunk.slot]), chunk.seq_len)

    @classmethod
    def from_input(
        cls,
        inp: ForwardInput,
        *,
        num_slots: int,
        max_model_len: int,
        max_short_query_len: int = DEFAULT_MAX_SHORT_QUERY_LEN,
    ) -> SlotBatch:
        """The step's split, from the indices the runtime uploaded with it (``inp.layout.indices``,
        part ``"attention"``); planned and uploaded here only for a forward called without one."""
        found = part_tensors(inp, PART)
        if found is None:
            part = cls.plan(
                inp.layout, num_slots=num_slots, max_model_len=max_model_len, device=inp.device,
                max_short_query_len=max_short_query_len,
            )  # fmt: skip
            found = part.meta, upload_part(part.arrays, inp.device)
        meta, tensors = found
        if not isinstance(meta, _SlotPlan):
            raise ContractViolation(f"index plan part {PART!r} was not built by SlotBatch.plan.")
        return cls.bind(meta, tensors, inp.device)

    @staticmethod
    def plan(
        layout: BatchLayout,
        *,
        num_slots: int,
        max_model_len: int,
        device: torch.device,
        max_short_query_len: int = DEFAULT_MAX_SHORT_QUERY_LEN,
    ) -> PlanPart:
        """On the host: the step's row split and the index arrays it reads (no device work)."""
        # The layout's host tensors, read as numpy: a step costs a few array ops, not a loop per row.
        qsl = layout.query_start_loc.numpy().astype(np.int64)  # [num_rows + 1]
        seq_lens = layout.seq_lens.numpy().astype(np.int64)  # [num_rows]
        slots = layout.slots.numpy().astype(np.int64)  # [num_rows]
        bad = np.flatnonzero((slots < 0) | (slots >= num_slots))
        if bad.size:
            raise ContractViolation(
                f"rows {bad.tolist()} use slots {slots[bad].tolist()}, outside the "
                f"{num_slots} allocated slots; call model.allocate_slots with enough slots."
            )
        too_long = np.flatnonzero(seq_lens > max_model_len)
        if too_long.size:
            raise ConfigError(
                f"rows {too_long.tolist()} reach seq_len {seq_lens[too_long].tolist()}, "
                f"beyond max_model_len={max_model_len}; cap prompt + max_tokens at max_model_len."
            )
        starts = qsl[:-1]  # [num_rows]
        query_lens = qsl[1:] - starts  # [num_rows]
        num_computed = seq_lens - query_lens  # [num_rows]
        is_short = query_lens <= max_short_query_len  # [num_rows] bool
        long_rows = tuple(
            (int(slots[r]), int(starts[r]), int(qsl[r + 1]), int(num_computed[r]))
            for r in np.flatnonzero(~is_short).tolist()
        )
        short = _Rows(slots[is_short], starts[is_short], query_lens[is_short], num_computed[is_short])
        planned = _plan_short_rows(short, device, covers_step=not long_rows)
        if planned is None:
            return PlanPart(_SlotPlan(None, long_rows), ())
        return PlanPart(_SlotPlan(planned.meta, long_rows), planned.arrays)

    @classmethod
    def bind(cls, meta: _SlotPlan, tensors: tuple[Tensor, ...], device: torch.device) -> SlotBatch:
        """On the stream: the split over the uploaded index tensors (views; masks made on the device)."""
        short = None if meta.short is None else _bind_short_rows(meta.short, tensors, device)
        return cls(short, tuple(_long_row(*row, device) for row in meta.long_rows))


PART = "attention"
"""The name of :class:`SlotBatch`'s part of a model's index plan."""


@dataclass(frozen=True, slots=True)
class _ShortPlan:
    """The short rows' host-only plan: shapes, run bounds and which index arrays were sent."""

    num_rows: int
    q_max: int
    padded: bool
    identity: bool  # the short tokens are the whole step, in flat order: no write_tokens
    in_place: bool  # every row sits at its own span row: no span_index
    span: int
    runs: tuple[tuple[int, int, int, int, bool], ...]  # (slot_lo, slot_hi, kv_len, offset, needs_mask)
    host_biases: tuple[Tensor | None, ...] | None  # per run, on a CPU device (built on the host)


@dataclass(frozen=True, slots=True)
class _SlotPlan:
    short: _ShortPlan | None
    long_rows: tuple[tuple[int, int, int, int], ...]  # (slot, start, end, num_computed)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The short rows' host metadata (``[R]`` int64 each)."""

    slots: np.ndarray
    starts: np.ndarray
    query_lens: np.ndarray
    num_computed: np.ndarray


def _slot_runs(sorted_slots: np.ndarray, kv_lens: np.ndarray) -> list[tuple[int, int]]:
    """``[first, last]`` indices into ``sorted_slots`` of each run of one attention call.

    A run ``[i, j]`` reads ``(slot_j - slot_i + 1) * max(kv_lens[i..j])`` key positions (its holes
    and the padding of its shorter rows included) and costs one call, priced at
    :data:`RUN_COST_KEYS` positions. Walking the rows in slot order, each row joins the current run
    when what that adds to the run's reads is less than a run of its own would cost; else it
    starts one. One pass of integer arithmetic per step (an exact split by dynamic programming
    measured ~0.5 ms per step at 50 rows, a tenth of a tiny model's step).
    """
    slots, lens = sorted_slots.tolist(), kv_lens.tolist()
    runs, first = [], 0
    lo, longest, reads = slots[0], lens[0], lens[0]
    for j in range(1, len(slots)):
        grown = max(longest, lens[j])
        joined = (slots[j] - lo + 1) * grown
        if joined - reads < lens[j] + RUN_COST_KEYS:
            longest, reads = grown, joined
            continue
        runs.append((first, j - 1))
        first, lo, longest, reads = j, slots[j], lens[j], lens[j]
    runs.append((first, len(slots) - 1))
    return runs


def _plan_short_rows(
    short: _Rows, device: torch.device, *, covers_step: bool
) -> PlanPart | None:
    """The short rows' plan (meta: a :class:`_ShortPlan`), ``None`` without short rows."""
    num_rows = short.slots.shape[0]
    if not num_rows:
        return None
    query_lens = short.query_lens[:, None]  # [R, 1]
    q_max = int(query_lens.max())
    padded = bool(np.count_nonzero(query_lens != q_max))
    q = np.arange(q_max)[None, :]  # [1, Q]
    real = np.minimum(q, query_lens - 1)  # [R, Q]: padding repeats the row's last query
    token_index = short.starts[:, None] + real  # [R, Q]
    query_pos = short.num_computed[:, None] + real  # [R, Q]
    if padded:
        valid = q < query_lens  # [R, Q] bool: real (unpadded) query tokens, row-major like the flat order
        write_slots = np.broadcast_to(short.slots[:, None], valid.shape)[valid]  # [n]
        write_pos = (short.num_computed[:, None] + q)[valid]  # [n]
        write_tokens = (short.starts[:, None] + q)[valid]  # [n]
        valid_src = (np.arange(num_rows)[:, None] * q_max + q)[valid]  # [n]
    else:  # every row has Q real queries: the write lists are the padded ones, flattened
        write_slots = np.repeat(short.slots, q_max)  # [n]
        write_pos, write_tokens = query_pos.reshape(-1), token_index.reshape(-1)  # [n] each
        valid_src = write_tokens[:0]

    # Runs of consecutive slots, each attended in place; span_index places every row in its run.
    order = np.argsort(short.slots, kind="stable")  # [R]
    sorted_slots = short.slots[order]  # [R]
    seq_lens = short.num_computed + short.query_lens  # [R]
    run_bounds = _slot_runs(sorted_slots, seq_lens[order])
    span_index = np.empty(num_rows, dtype=np.int64)  # [R]
    runs_meta = []  # (slot_lo, slot_hi, kv_len, offset, needs_mask)
    offset = 0
    for first, last in run_bounds:
        lo, hi = int(sorted_slots[first]), int(sorted_slots[last]) + 1
        members = order[first : last + 1]
        span_index[members] = offset + sorted_slots[first : last + 1] - lo
        kv_len = int(seq_lens[members].max())
        full = hi - lo == members.shape[0]
        needs_mask = q_max > 1 or not full or bool(np.count_nonzero(seq_lens[members] != kv_len))
        runs_meta.append((lo, hi, kv_len, offset, needs_mask))
        offset += hi - lo
    span = offset
    in_place = span == num_rows and bool((span_index == np.arange(num_rows)).all())
    # Query positions over the span: a hole's are "past every key" (its output is never read; the
    # keys it sees are finite cache values, so nothing turns into NaN).
    span_qpos = np.full((span, q_max), np.iinfo(np.int32).max, dtype=np.int64)  # [span, Q]
    span_qpos[span_index] = query_pos

    # Without padding and prefill rows, the short tokens are the whole step, in flat order.
    identity = covers_step and not padded
    upload_qpos = device.type != "cpu" and any(m[4] for m in runs_meta)
    host_biases = None
    if device.type == "cpu":  # numpy on the host: a few µs cheaper per step than torch ops
        host_biases = tuple(
            torch.from_numpy(_key_bias(np.arange(kv_len) > span_qpos[off : off + hi - lo, :, None])).unsqueeze(1)
            if needs_mask else None
            for lo, hi, kv_len, off, needs_mask in runs_meta
        )  # per run: [n, 1, Q, L] float32  # fmt: skip
    empty = valid_src[:0]
    arrays = (
        short.slots, token_index.reshape(-1), write_slots, write_pos,
        empty if identity else write_tokens, valid_src if padded else empty,
        empty if in_place else span_index, span_qpos.reshape(-1) if upload_qpos else empty,
    )  # fmt: skip
    plan = _ShortPlan(
        num_rows, q_max, padded, identity, in_place, span, tuple(runs_meta), host_biases
    )
    return PlanPart(plan, tuple([np.ascontiguousarray(a, dtype=np.int64) for a in arrays]))


def _bind_short_rows(plan: _ShortPlan, tensors: tuple[Tensor, ...], device: torch.device) -> ShortRows:
    slots, token_index_t, w_slots, w_pos, w_tokens, src, span_index_t, span_qpos_t = tensors
    num_rows, q_max, span = plan.num_rows, plan.q_max, plan.span
    runs = []
    for i, (lo, hi, kv_len, off, needs_mask) in enumerate(plan.runs):
        key_bias = None
        if plan.host_biases is not None:
            key_bias = plan.host_biases[i]
        elif needs_mask:  # on the device, from the uploaded positions: no [n, Q, L] host-to-device copy
            qpos = span_qpos_t.view(span, q_max)[off : off + hi - lo]  # [n, Q]
            unreadable = torch.arange(kv_len, device=device) > qpos[:, :, None]  # [n, Q, L] bool
            key_bias = torch.zeros(unreadable.shape, device=device).masked_fill_(unreadable, -torch.inf)
            key_bias = key_bias.unsqueeze(1)  # [n, 1, Q, L]
        runs.append(SlotRun(lo, hi, kv_len, off, key_bias))
    return ShortRows(
        slots=slots,
        token_index=token_index_t.view(num_rows, q_max),
        runs=tuple(runs),
        span=span,
        span_index=None if plan.in_place else span_index_t,
        write_slots=w_slots,
        write_positions=w_pos,
        write_tokens=None if plan.identity else w_tokens,
        valid_src=src if plan.padded else None,
    )


def _key_bias(unreadable: np.ndarray) -> np.ndarray:
    """float32 ``0`` where a query may read a key, ``-inf`` where ``unreadable`` says it may not."""
    return np.where(unreadable, np.float32(-np.inf), np.float32(0.0))


def _long_row(slot: int, start: int, end: int, num_computed: int, device: torch.device) -> LongRow:
    seq_len = num_computed + end - start
    mask = None
    if num_computed and device.type != "cpu":
        # A chunk continuing a prefill, attended in one call: query i sits at position num_computed + i.
        # (On the CPU it is attended in blocks, each masked by a view of one shared table.)
        query_pos = torch.arange(num_computed, seq_len, device=device)  # [n]
        mask = (torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None])[None, None]
    return LongRow(slot, start, end, num_computed, seq_len, mask)
