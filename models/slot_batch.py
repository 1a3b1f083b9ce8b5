"""Per-step indices every slot-indexed layer reads: which slot and cache position each token is.

Built once per forward from the host-side :class:`~tokenstate.contracts.BatchLayout` (no device
sync: only host metadata is read) and shared by all layers of the step. Rows are split in two:

* **short rows** (decode, decode + drafts: ``query_len <= max_short_query_len``) are attended in
  one batched, masked attention over their slots' gathered caches — a decode step costs one
  attention call per layer however many requests are running;
* **long rows** (prefill chunks) are attended one at a time, each over its own slot's cache.

Index tensors are made on the host with a few numpy operations and uploaded in one packed copy (pinned,
non-blocking) so a CUDA step never waits on the host; prefill chunks need no index tensor at all
(their K/V are written as one slice of the slot's cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractViolation, ForwardInput

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
    slot_start: int | None  # the rows' slots are slot_start + 0..R-1 in order: read the caches as a slice
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


def _upload(values: np.ndarray, device: torch.device) -> Tensor:
    """Host ints to one int64 tensor on ``device`` (pinned, non-blocking copy off the CPU)."""
    packed = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))  # [len(values)]
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
        layout, device = inp.layout, inp.device
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
            _long_row(int(slots[r]), int(starts[r]), int(qsl[r + 1]), int(num_computed[r]), device)
            for r in np.flatnonzero(~is_short).tolist()
        )
        short = _Rows(slots[is_short], starts[is_short], query_lens[is_short], num_computed[is_short])
        return cls(_short_rows(short, device, covers_step=not long_rows), long_rows)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The short rows' host metadata (``[R]`` int64 each)."""

    slots: np.ndarray
    starts: np.ndarray
    query_lens: np.ndarray
    num_computed: np.ndarray


def _short_rows(short: _Rows, device: torch.device, *, covers_step: bool) -> ShortRows | None:
    num_rows = short.slots.shape[0]
    if not num_rows:
        return None
    query_lens = short.query_lens[:, None]  # [R, 1]
    q_max = int(query_lens.max())
    padded = bool((query_lens != q_max).any())
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
    # Without padding and prefill rows, the short tokens are the whole step, in flat order.
    identity = covers_step and not padded
    n = write_slots.shape[0]
    packed = _upload(
        np.concatenate((
            short.slots, token_index.reshape(-1), query_pos.reshape(-1), write_slots, write_pos,
            write_tokens[:0] if identity else write_tokens, valid_src,
        )),
        device,
    )  # fmt: skip
    sizes = (num_rows, num_rows * q_max, num_rows * q_max, n, n, 0 if identity else n, n if padded else 0)
    slots, token_index_t, query_pos_t, w_slots, w_pos, w_tokens, src = packed.split(sizes)
    seq_lens = short.num_computed + short.query_lens  # [R]
    first_slot = int(short.slots[0])
    kv_len = int(seq_lens.max())
    key_mask = None
    if q_max > 1 or bool((seq_lens != kv_len).any()):
        if device.type == "cpu":  # numpy: a few µs cheaper per step than two torch ops
            mask = np.arange(kv_len) <= query_pos[:, :, None]  # [R, Q, L] bool
            key_mask = torch.from_numpy(mask).unsqueeze(1)  # [R, 1, Q, L]
        else:  # on the device, from the uploaded positions: no [R, Q, L] host-to-device copy
            key_pos = torch.arange(kv_len, device=device)  # [L]
            key_mask = (key_pos <= query_pos_t.view(num_rows, q_max, 1)).unsqueeze(1)  # [R, 1, Q, L]
    return ShortRows(
        slots=slots,
        token_index=token_index_t.view(num_rows, q_max),
        key_mask=key_mask,
        kv_len=kv_len,
        slot_start=first_slot if bool((short.slots == first_slot + np.arange(num_rows)).all()) else None,
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
