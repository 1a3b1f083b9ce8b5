"""Per-step indices every slot-indexed layer reads: which slot and cache position each token is.

Built once per forward from the host-side :class:`~tokenstate.contracts.BatchLayout` (no device
sync: only host metadata is read) and shared by all layers of the step. Rows are split in two:

* **short rows** (decode, decode + drafts: ``query_len <= max_short_query_len``) are attended in
  one batched, masked attention over their slots' gathered caches — a decode step costs one
  attention call per layer however many requests are running;
* **long rows** (prefill chunks) are attended one at a time, each over its own slot's cache.

Index tensors are made on the host from plain ints and uploaded in one packed copy (pinned,
non-blocking) so a CUDA step never waits on the host; prefill chunks need no index tensor at all
(their K/V are written as one slice of the slot's cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractViolation, ForwardInput, RowSpan

__all__ = ["LongRow", "ShortRows", "SlotBatch"]

DEFAULT_MAX_SHORT_QUERY_LEN = 16
"""Rows with up to this many query tokens join the batched (decode) attention."""


@dataclass(frozen=True, slots=True)
class ShortRows:
    """All short rows of a step, padded to a common query length ``Q`` and key length ``L``."""

    slots: Tensor  # [R] int64, device
    token_index: Tensor  # [R, Q] int64, device: flat token of each query (padding repeats the last)
    key_mask: Tensor | None  # [R, 1, Q, L] bool, device (key pos <= query pos); None: all keys valid
    kv_len: int  # L: longest seq_len among the short rows
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
    key_mask: Tensor | None  # [1, 1, n, seq_len] bool, device; None when num_computed == 0


def _upload(values: list[int], device: torch.device) -> Tensor:
    """Host ints to one int64 tensor on ``device`` (pinned, non-blocking copy off the CPU)."""
    packed = torch.tensor(values, dtype=torch.int64)  # [len(values)]
    if device.type == "cpu":
        return packed
    return packed.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True, slots=True)
class SlotBatch:
    """The short/long row split of one step, with the indices each part reads and writes."""

    short_rows: ShortRows | None
    long_rows: tuple[LongRow, ...]

    @classmethod
    def from_input(
        cls,
        inp: ForwardInput,
        *,
        num_slots: int,
        max_model_len: int,
        max_short_query_len: int = DEFAULT_MAX_SHORT_QUERY_LEN,
    ) -> SlotBatch:
        rows, device = inp.layout.rows, inp.device
        bad = [r for r in rows if not 0 <= r.slot < num_slots]
        if bad:
            raise ContractViolation(
                f"rows {[r.row for r in bad]} use slots {[r.slot for r in bad]}, outside the "
                f"{num_slots} allocated slots; call model.allocate_slots with enough slots."
            )
        too_long = [r for r in rows if r.seq_len > max_model_len]
        if too_long:
            raise ConfigError(
                f"rows {[r.row for r in too_long]} reach seq_len {[r.seq_len for r in too_long]}, "
                f"beyond max_model_len={max_model_len}; cap prompt + max_tokens at max_model_len."
            )
        short = [r for r in rows if r.query_len <= max_short_query_len]
        long_rows = tuple(
            _long_row(r.slot, r.start, r.end, r.num_computed, device)
            for r in rows
            if r.query_len > max_short_query_len
        )
        return cls(_short_rows(short, device, covers_step=not long_rows), long_rows)


def _short_rows(short: list[RowSpan], device: torch.device, *, covers_step: bool) -> ShortRows | None:
    if not short:
        return None
    num_rows = len(short)
    q_max = max(r.query_len for r in short)
    padded = any(r.query_len != q_max for r in short)
    token_index, query_pos, write_slots, write_pos, write_tokens, valid_src = [], [], [], [], [], []
    for i, r in enumerate(short):  # bounded: at most max_short_query_len tokens per row
        for q in range(q_max):
            real = min(q, r.query_len - 1)
            token_index.append(r.start + real)
            query_pos.append(r.num_computed + real)
            if q < r.query_len:
                write_slots.append(r.slot)
                write_pos.append(r.num_computed + q)
                write_tokens.append(r.start + q)
                valid_src.append(i * q_max + q)
    # Without padding and prefill rows, the short tokens are the whole step, in flat order.
    identity = covers_step and not padded
    n = len(write_slots)
    packed = _upload(
        [r.slot for r in short] + token_index + query_pos + write_slots + write_pos
        + ([] if identity else write_tokens) + (valid_src if padded else []),
        device,
    )
    parts, offset = [], 0
    for size in (num_rows, num_rows * q_max, num_rows * q_max, n, n, 0 if identity else n, n if padded else 0):
        parts.append(packed[offset : offset + size])
        offset += size
    slots, token_index_t, query_pos_t, w_slots, w_pos, w_tokens, src = parts
    kv_len = max(r.seq_len for r in short)
    key_mask = None
    if q_max > 1 or any(r.seq_len != kv_len for r in short):
        key_pos = torch.arange(kv_len, device=device)  # [L]
        key_mask = (key_pos <= query_pos_t.view(num_rows, q_max, 1)).unsqueeze(1)  # [R, 1, Q, L]
    return ShortRows(
        slots=slots,
        token_index=token_index_t.view(num_rows, q_max),
        key_mask=key_mask,
        kv_len=kv_len,
        write_slots=w_slots,
        write_positions=w_pos,
        write_tokens=None if identity else w_tokens,
        valid_src=src if padded else None,
    )


def _long_row(slot: int, start: int, end: int, num_computed: int, device: torch.device) -> LongRow:
    seq_len = num_computed + end - start
    mask = None
    if num_computed:
        # A chunk continuing a prefill: query i sits at position num_computed + i.
        query_pos = torch.arange(num_computed, seq_len, device=device)  # [n]
        mask = (torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None])[None, None]
    return LongRow(slot, start, end, num_computed, seq_len, mask)
