"""Stall detection: a hang is a failure, not a pass.

A scheduler or runner bug can make an engine spin without ever finishing — two requests preempting
each other forever, a request that is never scheduled again, drafts whose count never resolves.
Without a detector such a bug only shows as a test that hangs until an external timeout. The
:class:`ProgressWatchdog` is called once per engine step and raises :class:`EngineStalledError`,
naming every unfinished request and where it stands, after ``limit`` consecutive steps without
progress.

**Progress** is monotonic evidence that the engine gets closer to the end: a request finished, a
request's output grew, or a request's ``num_computed`` passed the highest value it ever reached (a
prefill chunk ran). Re-prefilling tokens after a preemption is not progress by itself, so the
default limit leaves room for the longest recompute: ``max_model_len / max_num_batched_tokens``
steps, twice, plus slack for steps that only wait for an in-flight token.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenstate.contracts import TokenStateError
from tokenstate.runtime.request import Request

__all__ = ["EngineStalledError", "ProgressWatchdog", "default_stall_limit"]


class EngineStalledError(TokenStateError):
    """The engine ran ``steps`` steps without progress; ``request_ids`` are the unfinished requests."""

    def __init__(self, message: str, *, steps: int, request_ids: tuple[int, ...]) -> None:
        super().__init__(message)
        self.steps = steps
        self.request_ids = request_ids


def default_stall_limit(max_model_len: int, max_num_batched_tokens: int) -> int:
    """Steps without progress after which an engine counts as stalled (see the module docstring)."""
    recompute = -(-max_model_len // max_num_batched_tokens)  # ceil: the longest re-prefill
    return 2 * recompute + 32


def _describe(req: Request) -> str:
    where = f"slot {req.slot}" if req.slot >= 0 else "waiting"
    return (
        f"request {req.request_id} ({where}, {req.num_computed}/{req.num_tokens} tokens computed, "
        f"{len(req.output_token_ids)}/{req.params.max_tokens} generated, {req.num_inflight} in flight"
        f"{', awaiting drafts' if req.awaiting_drafts else ''})"
    )


class ProgressWatchdog:
    """Counts consecutive steps without progress; raises once ``limit`` is reached."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise TokenStateError(f"ProgressWatchdog: limit must be a positive int, got {limit!r}.")
        self.limit = limit
        self._high_water: dict[int, tuple[int, int]] = {}  # id(request) -> (num_computed, outputs)
        self._idle_steps = 0

    def after_step(self, unfinished: Iterable[Request], num_finished: int) -> None:
        """Record one engine step: ``unfinished`` requests now, ``num_finished`` finished in it."""
        pending = list(unfinished)
        progressed = num_finished > 0
        seen: dict[int, tuple[int, int]] = {}
        for req in pending:
            best_computed, best_outputs = self._high_water.get(id(req), (-1, -1))
            outputs = len(req.output_token_ids)
            if req.num_computed > best_computed or outputs > best_outputs:
                progressed = True
            seen[id(req)] = (max(best_computed, req.num_computed), max(best_outputs, outputs))
        if len(seen) < len(self._high_water):
            progressed = True  # a request left (finished or aborted) without being counted
        self._high_water = seen
        self._idle_steps = 0 if progressed or not pending else self._idle_steps + 1
        if self._idle_steps >= self.limit:
            stuck = tuple(sorted(req.request_id for req in pending))
            raise EngineStalledError(
                f"engine stalled: {self._idle_steps} steps without progress (no request finished, "
                f"generated a token or computed a new position). Unfinished: "
                + "; ".join(_describe(r) for r in sorted(pending, key=lambda r: r.request_id))
                + ". This is a scheduler or runner bug (a livelock); please report it with the "
                "requests' sampling parameters and the engine's limits.",
                steps=self._idle_steps,
                request_ids=stuck,
            )

    def reset(self) -> None:
        """Forget every request (after an abort)."""
        self._high_water.clear()
        self._idle_steps = 0
