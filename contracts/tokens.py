"""Type states for token ids: :class:`HostTokens` and :class:`DeviceTokens`.

On the async path the host's token-id buffer holds :data:`PLACEHOLDER` at every spliced position,
while the real ids exist only on the execution device. ``HostTokens`` carries the host ids together
with the per-position stale mask computed by the one row predicate, and refuses to hand out ids that
include a stale position. ``DeviceTokens`` carries the authoritative ids; it can only be made by a
combine step (which splices the device-side sampled tokens in) or by uploading host ids that are
entirely fresh, so holding one *is* the proof that no placeholder is inside.
"""

from __future__ import annotations

import itertools
from typing import Final, final

import numpy as np
import torch

from tokenstate.contracts.errors import ConfigError, ContractViolation, StaleHostTokensError
from tokenstate.contracts.running import running_forward

__all__ = ["PLACEHOLDER", "TOKEN_ID_DTYPES", "DeviceTokens", "HostTokens"]

PLACEHOLDER: Final[int] = -1
"""Value the host buffer holds at spliced positions. Outside every vocabulary, so a guarded
embedding refuses it instead of reading a real (wrong) row."""

TOKEN_ID_DTYPES: Final[tuple[torch.dtype, ...]] = (torch.int32, torch.int64)

_CPU: Final = torch.device("cpu")
_UNSIGNED: Final = {4: np.uint32, 8: np.uint64}  # itemsize of int32 / int64 -> same-width unsigned


def _all_below(values: np.ndarray, upper: int) -> bool:
    """Whether every value of a non-empty int32/int64 array lies in ``[0, upper)``, in one reduction:
    viewed as unsigned, a negative value is huge, so ``max < upper`` checks both ends."""
    return int(values.view(_UNSIGNED[values.dtype.itemsize]).max()) < upper

_STALE_FIX = (
    "Fix: read `inp.device_tokens.ids` (or `inp.embedding_ids()`) in the forward. Under tokenstate's "
    "runner a step with spliced rows reaches only a forward whose factory declares "
    "honors_device_token_ids=True, and this forward breaks that promise: read the device ids, or "
    "declare False (the runner then takes the synchronous host path for those steps). In an engine "
    "of your own, hand a forward that reads host ids only steps whose host ids are fresh."
)


def _require_ids(name: str, ids: object, device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        raise ContractViolation(f"{name}: ids must be a torch.Tensor, got {type(ids).__name__}.")
    if ids.dim() != 1:
        raise ContractViolation(f"{name}: ids must be [num_tokens], got shape {tuple(ids.shape)}.")
    if ids.dtype not in TOKEN_ID_DTYPES:
        raise ContractViolation(f"{name}: ids must be int32 or int64, got {ids.dtype}.")
    if device is not None and ids.device != device:
        raise ContractViolation(f"{name}: ids must be on {device}, got {ids.device}.")
    return ids


def _check_fresh_positions(ids: torch.Tensor, stale: np.ndarray) -> None:
    """Refuse a negative id (a placeholder) at a position the stale mask calls fresh.

    Host ids are on the CPU, so this costs no device sync and is checked in every checks mode: a
    fresh position holding a placeholder is exactly what the type state exists to rule out.
    """
    values = ids.numpy()  # [num_tokens], shares memory
    if np.count_nonzero(np.greater(values < 0, stale)):  # negative and not stale
        negative = np.flatnonzero((values < 0) & ~stale)  # [num_bad] positions
        raise ContractViolation(
            f"HostTokens: positions {negative[:8].tolist()} are not marked stale but hold negative ids "
            f"(PLACEHOLDER is {PLACEHOLDER}); a fresh position must hold a real token id. Mark the "
            "spliced positions in the stale mask you pass to HostTokens(...) (stale_position_mask() "
            "computes it; HostTokens.fresh(...) marks none), or put the real ids there."
        )


def _check_in_vocabulary(ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse device ids outside ``[0, vocab_size)`` wherever that costs no device sync.

    Holding :class:`DeviceTokens` is the proof that no placeholder is inside. On the CPU that costs
    one numpy reduction, so it is checked in every checks mode; on a CUDA device a reduction is a device
    sync — the very thing the async path exists to avoid — so there the guarded embedding is the
    check.
    """
    if not ids.is_cpu or not ids.numel():
        return
    values = ids.numpy()  # [num_tokens], shares memory
    if not _all_below(values, vocab_size):
        lo, hi = int(values.min()), int(values.max())
        bad = np.flatnonzero((values < 0) | (values >= vocab_size))[:8].tolist()
        raise ContractViolation(
            f"DeviceTokens: ids must lie in [0, {vocab_size}), got min {lo}, max {hi} (positions "
            f"{bad}); a PLACEHOLDER ({PLACEHOLDER}) here means the combine step did not splice "
            "every stale position. Fix the combine step (or the vocab_size passed to it)."
        )


def _rows_of(positions: list[int], query_start_loc: list[int]) -> list[int]:
    rows: list[int] = []
    row = 0
    for pos in positions:  # positions are sorted; walk the row boundaries once
        while query_start_loc[row + 1] <= pos:
            row += 1
        if not rows or rows[-1] != row:
            rows.append(row)
    return rows


@final
class HostTokens:
    """Token ids on the host plus the per-position stale mask.

    Args:
        ids: ``[num_tokens]`` int32/int64 CPU tensor; ``PLACEHOLDER`` at stale positions.
        stale: ``[num_tokens]`` bool CPU tensor from
            :func:`~tokenstate.contracts.stale_position_mask`.
        query_start_loc: ``[num_rows + 1]`` integer CPU tensor (row boundaries, for error messages
            and per-row reads).
        slots: ``[num_rows]`` integer CPU tensor, the persistent slot of each row.
    """

    __slots__ = ("_forward", "_ids", "_query_start_loc", "_slots", "_stale", "_stale_positions")

    def __init__(
        self,
        ids: torch.Tensor,
        stale: torch.Tensor,
        query_start_loc: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        ids = _require_ids("HostTokens", ids, _CPU)
        if not isinstance(stale, torch.Tensor) or stale.dtype != torch.bool or stale.shape != ids.shape:
            raise ContractViolation(
                f"HostTokens: stale must be a bool tensor of shape {tuple(ids.shape)} (one flag per "
                f"position), got {getattr(stale, 'dtype', type(stale).__name__)} "
                f"{tuple(getattr(stale, 'shape', ()))}."
            )
        if not (stale.is_cpu and query_start_loc.is_cpu and slots.is_cpu):
            raise ContractViolation("HostTokens: stale, query_start_loc and slots must be CPU tensors.")
        num_rows = slots.shape[0]
        if slots.dim() != 1 or query_start_loc.shape != (num_rows + 1,):
            raise ContractViolation(
                f"HostTokens: query_start_loc must be [num_rows + 1] for slots [num_rows]; got "
                f"{tuple(query_start_loc.shape)} and {tuple(slots.shape)}."
            )
        qsl = query_start_loc.tolist()
        if qsl[0] != 0 or qsl[-1] != ids.shape[0] or any(b < a for a, b in itertools.pairwise(qsl)):
            raise ContractViolation(
                f"HostTokens: query_start_loc must rise from 0 to num_tokens={ids.shape[0]}, got {qsl}."
            )
        self._ids = ids  # [num_tokens]
        # The registered forward these tokens were handed to (_handed_to_forward): from then on
        # the raw buffer is refused in every thread — a context variable marks only the forward's
        # own — and for good: a model may keep a step's tokens and read them in a later step.
        self._forward: str | None = None
        self._stale = stale  # [num_tokens] bool
        self._query_start_loc = qsl  # num_rows + 1 ints
        self._slots = slots.tolist()  # num_rows ints
        # numpy's flatnonzero: a few µs where torch's CPU nonzero costs ~20 (once per step).
        stale_np = stale.numpy()
        self._stale_positions: list[int] = np.flatnonzero(stale_np).tolist()
        _check_fresh_positions(ids, stale_np)

    @classmethod
    def fresh(cls, ids: torch.Tensor, query_start_loc: torch.Tensor, slots: torch.Tensor) -> HostTokens:
        """Host tokens with no stale position (sync mode, prefill-only steps)."""
        return cls(ids, torch.zeros(ids.shape, dtype=torch.bool), query_start_loc, slots)

    @property
    def num_tokens(self) -> int:
        return self._ids.shape[0]

    @property
    def num_rows(self) -> int:
        return len(self._slots)

    @property
    def has_stale(self) -> bool:
        """Whether any position holds a placeholder (cheap: computed at construction)."""
        return bool(self._stale_positions)

    @property
    def stale(self) -> torch.Tensor:
        """``[num_tokens]`` bool: positions whose real id exists only on the device."""
        return self._stale

    @property
    def stale_rows(self) -> tuple[int, ...]:
        """Batch rows with at least one stale position."""
        return tuple(_rows_of(self._stale_positions, self._query_start_loc))

    @property
    def ids(self) -> torch.Tensor:
        """``[num_tokens]`` host ids; raises :class:`StaleHostTokensError` if any is stale."""
        if self._stale_positions:
            self._raise_stale(self._stale_positions, "ids")
        return self._ids

    def row_ids(self, row: int) -> torch.Tensor:
        """``[query_len]`` host ids of one row; fresh rows stay readable when others are stale (as a
        copy then, whose storage holds that row alone)."""
        if not 0 <= row < self.num_rows:
            raise ContractViolation(f"HostTokens.row_ids: row {row} is outside [0, {self.num_rows}).")
        start, end = self._query_start_loc[row], self._query_start_loc[row + 1]
        stale_here = [p for p in self._stale_positions if start <= p < end]
        if stale_here:
            self._raise_stale(stale_here, f"row_ids({row})")
        if self._stale_positions:  # a copy: a view's storage would reach the other rows' placeholders
            return self._ids[start:end].clone()
        return self._ids[start:end]

    def placeholder_buffer(self) -> torch.Tensor:
        """``[num_tokens]`` raw host buffer *including* placeholders — input to a combine kernel.

        Only a combine step may consume this; embedding it is the bug this package exists to stop.
        Read inside a registered forward (an :func:`~tokenstate.contracts.entry_point` call) on a
        step with stale positions it raises :class:`StaleHostTokensError`, as ``.ids`` does: an
        embedding that masks out-of-range ids (vLLM's vocabulary-parallel one) would otherwise turn
        the placeholders into fluent wrong tokens, and a plain ``nn.Embedding`` into an
        ``IndexError`` naming nothing.
        """
        if self._stale_positions:
            forward = running_forward() or self._forward
            if forward is not None:
                self._raise_stale(list(self._stale_positions), f"placeholder_buffer() in forward {forward}")
        return self._ids

    def _handed_to_forward(self, forward: str) -> None:
        """Mark these tokens as handed to the registered forward ``forward`` (an entry point marks
        its input's): from then on :meth:`placeholder_buffer` refuses the raw buffer of a stale
        step in every thread, for good — a thread pool or a ``threading.Thread`` does not inherit
        the running-forward context variable, and a model may keep a step's tokens for a later
        step. The combine step reads the buffer before the forward runs. One way: a later call
        never clears the mark."""
        if self._forward is None:
            self._forward = forward

    def _raise_stale(self, positions: list[int], what: str, fix: str = "") -> None:
        rows = _rows_of(positions, self._query_start_loc)
        slots = [self._slots[r] for r in rows]
        shown = positions[:8]
        more = "" if len(positions) <= 8 else f" (+{len(positions) - 8} more)"
        raise StaleHostTokensError(
            f"HostTokens.{what}: stale host token ids read at rows {rows} (slots {slots}), "
            f"positions {shown}{more}: on the async path these positions hold PLACEHOLDER "
            f"({PLACEHOLDER}) on the host and their real ids exist only on the device. {fix or _STALE_FIX}",
            rows=tuple(rows),
            slots=tuple(slots),
            positions=tuple(positions),
        )

    def __repr__(self) -> str:
        return (
            f"HostTokens(num_tokens={self.num_tokens}, num_rows={self.num_rows}, "
            f"stale_rows={list(self.stale_rows)})"
        )


_ISSUE_KEY = object()
_FROM_HOST_FIX = (
    "DeviceTokens.from_host uploads only a step with nothing stale; for this one, splice the "
    "device-side sampled tokens in at the stale positions (your combine step) and wrap the result "
    "with DeviceTokens.from_combine(ids, vocab_size=...)."
)


@final
class DeviceTokens:
    """Authoritative token ids on the execution device (CUDA, or the CPU for the CPU mirror).

    Made only by :meth:`from_combine` (a runtime's combine step spliced the device-side sampled
    tokens in) or :meth:`from_host` (an upload of entirely fresh host ids). Calling the class
    directly raises.
    """

    __slots__ = ("_ids", "_vocab_size")

    def __init__(self, ids: torch.Tensor, vocab_size: int, _key: object = None) -> None:
        if _key is not _ISSUE_KEY:
            raise ContractViolation(
                "DeviceTokens cannot be constructed directly: use DeviceTokens.from_combine(ids, "
                "vocab_size=...) in a combine step, or DeviceTokens.from_host(host_tokens, device, "
                "vocab_size=...) for fresh host ids."
            )
        ids = _require_ids("DeviceTokens", ids)
        if not isinstance(vocab_size, int) or vocab_size <= 0:
            raise ContractViolation(f"DeviceTokens: vocab_size must be a positive int, got {vocab_size!r}.")
        if not ids.is_contiguous():
            raise ContractViolation("DeviceTokens: ids must be contiguous.")
        _check_in_vocabulary(ids, vocab_size)
        self._ids = ids  # [num_tokens]
        self._vocab_size = vocab_size

    @classmethod
    def from_combine(cls, ids: torch.Tensor, *, vocab_size: int) -> DeviceTokens:
        """Wrap the output of a combine step (host ids with device-side tokens spliced in)."""
        return cls(ids, vocab_size, _ISSUE_KEY)

    @classmethod
    def from_host(
        cls, host: HostTokens, device: torch.device | str, *, vocab_size: int
    ) -> DeviceTokens:
        """Upload entirely fresh host ids; refuses (naming the rows) if any position is stale."""
        if host.has_stale:
            host._raise_stale(host._stale_positions, "ids (in DeviceTokens.from_host)", _FROM_HOST_FIX)
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"DeviceTokens.from_host: device={str(device)!r} but CUDA is not available in this "
                "process; upload to device='cpu' (the CPU runs the same data flow)."
            )
        return cls(host.ids.to(device, non_blocking=True), vocab_size, _ISSUE_KEY)

    @property
    def ids(self) -> torch.Tensor:
        """``[num_tokens]`` int32/int64 ids on the execution device."""
        return self._ids

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        return self._ids.device

    @property
    def num_tokens(self) -> int:
        return self._ids.shape[0]

    def __repr__(self) -> str:
        return f"DeviceTokens(num_tokens={self.num_tokens}, device={self.device}, dtype={self._ids.dtype})"
