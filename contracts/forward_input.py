"""The per-step forward input: host tokens, optional device tokens, positions, batch layout.

A runner builds exactly one :class:`ForwardInput` per step and its invariants are validated once,
here, at construction — entry points then only check identity and metadata, which keeps the checked
boundary nearly free. Validation reads metadata and host tensors only; it never syncs a device.

It also carries the batch metadata a forward needs (``num_tokens``, ``num_rows``, ``num_logits``,
``logit_rows``, ``layout.rows``...), so no forward has to touch host token ids for metadata: such a
read raises on a step with spliced rows, and the routing checker reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tokenstate.contracts.errors import ContractViolation
from tokenstate.contracts.tokens import DeviceTokens, HostTokens, _all_below

__all__ = ["BatchLayout", "ForwardInput", "IndexPlan", "RowSpan", "StepIndices"]

_INT = (torch.int32, torch.int64)


@dataclass(frozen=True, slots=True)
class RowSpan:
    """One batch row, as plain ints: ``[num_computed, seq_len)`` of ``slot`` at flat ``[start, end)``."""

    row: int
    slot: int
    start: int  # flat index of the row's first query token
    end: int  # flat index one past its last query token
    num_computed: int  # tokens of this request already in the slot's KV/state
    num_drafts: int

    @property
    def query_len(self) -> int:
        return self.end - self.start

    @property
    def seq_len(self) -> int:
        return self.num_computed + self.query_len


def _host_int(name: str, t: object, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ContractViolation(f"BatchLayout.{name}: expected a torch.Tensor, got {type(t).__name__}.")
    if t.dtype not in _INT or not t.is_cpu or t.dim() != 1:  # is_cpu: no device object made
        raise ContractViolation(
            f"BatchLayout.{name}: expected a 1-D int32/int64 CPU tensor, got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}."
        )
    if shape is not None and t.shape != shape:  # torch.Size compares as a tuple
        raise ContractViolation(f"BatchLayout.{name}: expected shape {shape}, got {tuple(t.shape)}.")
    return t


@dataclass(frozen=True, slots=True)
class IndexPlan:
    """A model's index arrays for one step, built on the host from the :class:`BatchLayout`.

    The runtime uploads ``arrays`` in the step's one int64 staging copy (no forward uploads row
    metadata of its own) and hands them back on the device as :attr:`BatchLayout.indices`.

    Attributes:
        arrays: 1-D int64 host arrays, in the order the model reads them back.
        meta: the model's host-only facts about the step (row splits, run bounds...), opaque here.
    """

    arrays: tuple[np.ndarray, ...]
    meta: object

    def __post_init__(self) -> None:
        for i, a in enumerate(self.arrays):
            if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != 1:
                raise ContractViolation(
                    f"IndexPlan.arrays[{i}]: expected a 1-D int64 numpy array, got "
                    f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}; build index "
                    "arrays with dtype=np.int64."
                )


@dataclass(frozen=True, slots=True)
class StepIndices:
    """An :class:`IndexPlan` after the step's upload: its host-only facts and its arrays on the device.

    Built on the stream, where the step's upload lands: only the plan's ``meta`` travels with the
    step's device work, never its host arrays (which the staging copy already carried).

    Attributes:
        meta: the plan's :attr:`IndexPlan.meta`.
        tensors: the plan's arrays on the execution device, in order (int64 views of the step's
            staging copy, filled in stream order).
    """

    meta: object
    tensors: tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Host-side batch metadata of one step (all CPU tensors; ``rows`` as plain ints).

    Attributes:
        query_start_loc: ``[num_rows + 1]`` int32, flat start of each row's query.
        seq_lens: ``[num_rows]`` int32, ``num_computed + query_len`` per row.
        slots: ``[num_rows]`` int32, persistent slot of each row.
        num_drafts: ``[num_rows]`` int32, draft tokens at the end of each row's query.
        logits_indices: ``[num_logits]`` int64, flat positions whose logits the sampler reads.
    """

    query_start_loc: torch.Tensor  # [num_rows + 1] int32
    seq_lens: torch.Tensor  # [num_rows] int32
    slots: torch.Tensor  # [num_rows] int32
    num_drafts: torch.Tensor  # [num_rows] int32
    logits_indices: torch.Tensor  # [num_logits] int64
    _rows: list[tuple[RowSpan, ...]] = field(init=False, repr=False, compare=False)
    """Holds ``rows`` once built: a one-element list, empty until the first read."""
    _indices: StepIndices | None = field(init=False, repr=False, compare=False)
    """The model's device index tensors of this step (see :meth:`with_indices`)."""

    def __post_init__(self) -> None:
        # Validated here, once, with a few numpy operations (every step builds one layout, so each
        # op counts); the RowSpan objects are built only when ``rows`` is first read (most steps of
        # a dense model never read them).
        num_rows = _host_int("slots", self.slots).shape[0]
        qsl = _host_int("query_start_loc", self.query_start_loc, (num_rows + 1,)).numpy()
        seq = _host_int("seq_lens", self.seq_lens, (num_rows,)).numpy()
        drafts = _host_int("num_drafts", self.num_drafts, (num_rows,)).numpy()
        logits = _host_int("logits_indices", self.logits_indices).numpy()
        slots = self.slots.numpy()
        qlen = qsl[1:] - qsl[:-1]  # [num_rows]
        # np.count_nonzero: a fifth of the cost of .any() on a bool array this small.
        if qsl[0] != 0 or np.count_nonzero(qlen < 0):
            raise ContractViolation(f"BatchLayout.query_start_loc must rise from 0, got {qsl.tolist()}.")
        if len(set(slots.tolist())) != num_rows:  # a set of a few dozen ints: cheaper than np.unique
            raise ContractViolation(
                f"BatchLayout.slots must be distinct (one row per request), got {slots.tolist()}."
            )
        bad_rows = (seq < qlen) | (drafts < 0) | (drafts >= np.maximum(qlen, 1))  # [num_rows] bool
        if np.count_nonzero(bad_rows):
            r = int(np.flatnonzero(bad_rows)[0])
            raise ContractViolation(
                f"BatchLayout row {r}: seq_len={int(seq[r])}, query_len={int(qlen[r])}, "
                f"num_drafts={int(drafts[r])}; need seq_len >= query_len and 0 <= num_drafts < query_len."
            )
        num_tokens = int(qsl[-1])
        if logits.size and not _all_below(logits, num_tokens):
            raise ContractViolation(
                f"BatchLayout.logits_indices must lie in [0, num_tokens={num_tokens}), got {logits.tolist()}."
            )
        object.__setattr__(self, "_rows", [])
        object.__setattr__(self, "_indices", None)

    def with_indices(self, indices: StepIndices) -> BatchLayout:
        """This layout carrying the step's uploaded model indices (the runner calls it once).

        The host fields are shared, not re-validated: they are the ones this layout checked.
        """
        if not isinstance(indices, StepIndices):
            raise ContractViolation(
                f"BatchLayout.with_indices: expected StepIndices, got {type(indices).__name__}."
            )
        copy = object.__new__(BatchLayout)
        for name in ("query_start_loc", "seq_lens", "slots", "num_drafts", "logits_indices", "_rows"):
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "_indices", indices)
        return copy

    @property
    def indices(self) -> StepIndices | None:
        """The model's index tensors of this step, on the execution device, uploaded with the
        step's inputs; ``None`` when the runtime planned none (a forward called directly)."""
        return self._indices

    @property
    def rows(self) -> tuple[RowSpan, ...]:
        """Every row as plain ints, in batch order (built on first read, then kept)."""
        if not self._rows:
            qsl, seq = self.query_start_loc.tolist(), self.seq_lens.tolist()
            slots, drafts = self.slots.tolist(), self.num_drafts.tolist()
            self._rows.append(tuple(
                RowSpan(r, slots[r], qsl[r], qsl[r + 1], seq[r] - (qsl[r + 1] - qsl[r]), drafts[r])
                for r in range(len(slots))
            ))  # fmt: skip
        return self._rows[0]

    @property
    def num_rows(self) -> int:
        return self.slots.shape[0]

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def num_logits(self) -> int:
        return self.logits_indices.shape[0]

    @property
    def query_lens(self) -> torch.Tensor:
        """``[num_rows]`` int64 CPU: query tokens of each row this step."""
        qsl = self.query_start_loc.long()
        return qsl[1:] - qsl[:-1]

    @property
    def logit_rows(self) -> torch.Tensor:
        """``[num_logits]`` int64 CPU: the batch row each logit belongs to (for per-row logits work
        such as penalties, without touching token ids)."""
        qsl = self.query_start_loc.numpy()
        rows = np.searchsorted(qsl, self.logits_indices.numpy(), side="right") - 1  # [num_logits]
        return torch.from_numpy(rows.astype(np.int64))

    @property
    def logit_slots(self) -> torch.Tensor:
        """``[num_logits]`` int64 CPU: the persistent slot of each logit's request."""
        return self.slots.long().index_select(0, self.logit_rows)


def _check_logits_in_step(logits_indices: torch.Tensor, num_tokens: int) -> None:
    """The execution-device copy of ``logits_indices`` must point inside the step too. On the CPU
    that costs no sync; on a CUDA device only its shape is checked (``layout``'s host copy is
    validated by :class:`BatchLayout`)."""
    if logits_indices.device.type != "cpu" or not logits_indices.numel():
        return
    values = logits_indices.numpy()  # [num_logits]
    # Viewed as unsigned, a negative index is huge: one reduction checks both ends.
    if int(values.view(np.uint32 if values.dtype == np.int32 else np.uint64).max()) >= num_tokens:
        raise ContractViolation(
            f"ForwardInput.logits_indices must lie in [0, num_tokens={num_tokens}), got "
            f"{values[:8].tolist()}{' ...' if values.size > 8 else ''}; pass the same values as "
            "layout.logits_indices."
        )


@dataclass(frozen=True, slots=True)
class ForwardInput:
    """Everything a registered forward receives for one step.

    Attributes:
        host_tokens: host ids and their stale mask (always present).
        device_tokens: authoritative ids on the execution device; present whenever any position is
            stale (then reading ``host_tokens.ids`` raises), optionally present otherwise.
        positions: ``[num_tokens]`` int64 on the execution device.
        layout: host-side batch metadata.
        logits_indices: ``[num_logits]`` int64 on the execution device (same values as
            ``layout.logits_indices``).
        slots: ``[num_rows]`` int64 on the execution device (same values as ``layout.slots``).
    """

    host_tokens: HostTokens
    device_tokens: DeviceTokens | None
    positions: torch.Tensor  # [num_tokens] int64, execution device
    layout: BatchLayout
    logits_indices: torch.Tensor  # [num_logits] int64, execution device
    slots: torch.Tensor  # [num_rows] int64, execution device
    signature: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """What a checked entry point keys its proofs on (computed once here, read on every call)."""

    def __post_init__(self) -> None:
        if not isinstance(self.host_tokens, HostTokens):
            raise ContractViolation(
                f"ForwardInput.host_tokens must be HostTokens, got {type(self.host_tokens).__name__}."
            )
        if self.device_tokens is not None and not isinstance(self.device_tokens, DeviceTokens):
            raise ContractViolation(
                "ForwardInput.device_tokens must be DeviceTokens or None, got "
                f"{type(self.device_tokens).__name__}."
            )
        if not isinstance(self.layout, BatchLayout):
            raise ContractViolation(f"ForwardInput.layout must be BatchLayout, got {type(self.layout).__name__}.")
        n = self.host_tokens.num_tokens
        if self.layout.num_tokens != n or self.layout.num_rows != self.host_tokens.num_rows:
            raise ContractViolation(
                f"ForwardInput: layout has {self.layout.num_tokens} tokens in {self.layout.num_rows} rows "
                f"but host_tokens has {n} tokens in {self.host_tokens.num_rows} rows."
            )
        if self.host_tokens.has_stale and self.device_tokens is None:
            raise ContractViolation(
                f"ForwardInput: rows {list(self.host_tokens.stale_rows)} are stale on the host, so "
                "device_tokens is required: wrap the ids your combine step spliced (the device-side "
                "sampled tokens at the stale positions) with DeviceTokens.from_combine(ids, "
                "vocab_size=...); tokenstate's runner does this itself."
            )
        device = self.positions.device if isinstance(self.positions, torch.Tensor) else None
        self._check_tensor("positions", self.positions, (n,), device)
        self._check_tensor("logits_indices", self.logits_indices, (self.layout.num_logits,), device)
        self._check_tensor("slots", self.slots, (self.layout.num_rows,), device)
        _check_logits_in_step(self.logits_indices, n)
        if self.device_tokens is not None:
            if self.device_tokens.num_tokens != n or self.device_tokens.device != device:
                raise ContractViolation(
                    f"ForwardInput: device_tokens are [{self.device_tokens.num_tokens}] on "
                    f"{self.device_tokens.device}; expected [{n}] on {device} like positions."
                )
        dev = self.device_tokens
        signature = (
            type(self), n, self.layout.num_logits, self.layout.num_rows, device,
            None if dev is None else dev.ids.dtype,
        )  # fmt: skip
        object.__setattr__(self, "signature", signature)

    @staticmethod
    def _check_tensor(
        name: str, t: object, shape: tuple[int, ...], device: torch.device | None
    ) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype not in _INT:
            raise ContractViolation(
                f"ForwardInput.{name} must be an int32/int64 tensor, got "
                f"{getattr(t, 'dtype', type(t).__name__)}."
            )
        if tuple(t.shape) != shape or t.device != device:
            raise ContractViolation(
                f"ForwardInput.{name}: expected shape {shape} on {device}, got {tuple(t.shape)} on {t.device}."
            )

    @property
    def device(self) -> torch.device:
        """The execution device."""
        return self.positions.device

    @property
    def num_tokens(self) -> int:
        return self.host_tokens.num_tokens

    @property
    def num_logits(self) -> int:
        return self.layout.num_logits

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    @property
    def logit_rows(self) -> torch.Tensor:
        """``[num_logits]`` int64 CPU: the batch row of each logit (see :attr:`BatchLayout.logit_rows`)."""
        return self.layout.logit_rows

    @property
    def has_stale_rows(self) -> bool:
        return self.host_tokens.has_stale

    def embedding_ids(self) -> torch.Tensor:
        """``[num_tokens]`` ids to embed: the device ids when present, else the (fresh) host ids.

        The recommended read for a forward that honours device token ids; on the host branch the
        ids are moved to the execution device.
        """
        if self.device_tokens is not None:
            return self.device_tokens.ids
        return self.host_tokens.ids.to(self.device, non_blocking=True)
