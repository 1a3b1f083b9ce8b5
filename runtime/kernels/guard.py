"""Step guard: where guarded embeddings record out-of-vocabulary ids until the step's sync point.

On the async path nothing may read a device value mid-step (that is a host sync, the very thing the
path exists to avoid), so the guarded embedding cannot raise the moment it sees a ``PLACEHOLDER``.
Instead it records a per-position bad flag (a device tensor) into the *current* guard — a
context-local value, so concurrent runners on other threads or tasks never see each other's
records. The runner calls :meth:`StepGuard.raise_if_violated` at its single sync point (possibly
after the ``with`` block: the async runner resolves step N after launching step N + 1).
"""

from __future__ import annotations

import bisect
import contextvars
from dataclasses import dataclass
from types import TracebackType

import torch

from tokenstate.contracts import PLACEHOLDER, BatchLayout, ContractViolation, EmbeddedBadIdsError

__all__ = ["EmbeddedBadIdsError", "StepGuard", "current_guard", "raise_bad_ids"]

_SHOWN = 16  # positions listed in a message before "(+N more)"

_FIX = (
    "Fix: the forward embedded PLACEHOLDER/out-of-vocab ids: read inp.device_tokens.ids (or "
    "inp.embedding_ids()) instead of the host buffer and register the factory with "
    "honors_device_token_ids=True — or register it with honors_device_token_ids=False so the runner "
    "takes the synchronous host path; an id >= vocab means the tokenizer and the model disagree."
)

@dataclass(frozen=True, slots=True)
class _Record:
    bad: torch.Tensor  # [num_tokens] bool, execution device
    ids: torch.Tensor  # [num_tokens] int, a copy taken at the embedding (buffers get reused)
    vocab_size: int


def _listed(values: list[int]) -> str:
    more = "" if len(values) <= _SHOWN else f" (+{len(values) - _SHOWN} more)"
    return f"{values[:_SHOWN]}{more}"


def raise_bad_ids(
    bad: torch.Tensor, ids: torch.Tensor, vocab_size: int, layout: BatchLayout | None = None
) -> None:
    """Raise :class:`EmbeddedBadIdsError` for the flagged positions (reads the flags: a host sync).

    Args:
        bad: ``[num_tokens]`` bool, the embedding's per-position flags (at least one set).
        ids: ``[num_tokens]`` the embedded ids.
        vocab_size: the embedding table's row count.
        layout: the step's batch layout; when it matches ``num_tokens`` the rows and slots are named.
    """
    positions: list[int] = bad.nonzero().flatten().tolist()
    bad_ids: list[int] = ids.flatten()[positions].tolist()
    where = f"flat positions {_listed(positions)}"
    rows: list[int] = []
    slots: list[int] = []
    if layout is not None and layout.num_tokens == bad.numel():
        starts = layout.query_start_loc.tolist()
        rows = sorted({bisect.bisect_right(starts, p) - 1 for p in positions})
        slots = [layout.rows[r].slot for r in rows]
        where = f"rows {_listed(rows)} (slots {_listed(slots)}), {where}"
    elif layout is not None:
        where += f" (the layout has {layout.num_tokens} tokens, the embedding saw {bad.numel()})"
    placeholders = sum(1 for i in bad_ids if i == PLACEHOLDER)
    raise EmbeddedBadIdsError(
        f"guarded_embedding: ids outside [0, vocab={vocab_size}) reached the embedding at {where}: "
        f"ids {_listed(bad_ids)} ({placeholders} of them PLACEHOLDER={PLACEHOLDER}, a stale host "
        f"position). Their rows were zeroed, not clamped. {_FIX}",
        positions=tuple(positions),
        ids=tuple(bad_ids),
        rows=tuple(rows),
        slots=tuple(slots),
    )


class StepGuard:
    """Collects guarded-embedding bad flags for one runner step; raises at the sync point.

    Usage::

        guard = StepGuard()
        with guard:
            logits = forward(model, inp)  # embeddings record flags, never sync
        ...
        guard.raise_if_violated(inp.layout)  # the step's one sync point
    """

    __slots__ = ("_records", "_token")

    def __init__(self) -> None:
        self._records: list[_Record] = []
        self._token: contextvars.Token[StepGuard | None] | None = None

    def __enter__(self) -> StepGuard:
        if self._token is not None:
            raise ContractViolation(
                "StepGuard is already active; open one guard per step (nesting a fresh guard is fine)."
            )
        self._token = _current.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            _current.reset(token)

    def record(self, bad: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> None:
        """Keep one embedding's flags (``[num_tokens]`` bool, on device) until the sync point."""
        self._records.append(_Record(bad, ids.detach().clone(), vocab_size))

    @property
    def num_pending(self) -> int:
        """Embedding calls recorded and not yet checked."""
        return len(self._records)

    def raise_if_violated(self, layout: BatchLayout | None = None) -> None:
        """Check every recorded embedding with one host sync; raise naming rows, slots and ids.

        The records are consumed either way, so a guard can be reused for the next step.
        """
        records, self._records = self._records, []
        if not records:
            return
        if len(records) == 1:
            violated = bool(records[0].bad.any())
        else:
            violated = bool(torch.stack([r.bad.any() for r in records]).any())
        if not violated:
            return
        for record in records:
            if bool(record.bad.any()):
                raise_bad_ids(record.bad, record.ids, record.vocab_size, layout)


# Defined after the class: its annotation names StepGuard, and beartype's import hook evaluates
# module-level annotations when the assignment runs.
_current: contextvars.ContextVar[StepGuard | None] = contextvars.ContextVar(
    "tokenstate_step_guard", default=None
)


def current_guard() -> StepGuard | None:
    """The guard opened by the enclosing ``with StepGuard()`` in this context, if any."""
    return _current.get()
