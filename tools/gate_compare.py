"""How the gate scores one request on one comparison: the matched prefix and the first divergence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenstate.runtime.outputs import RequestOutput

__all__ = ["Divergence", "PathResult", "compare_tokens"]


@dataclass(frozen=True)
class Divergence:
    """The first output token where a path leaves its reference."""

    index: int  # output token index within the request
    expected: int
    got: int
    step: int | None  # engine step that sampled the token
    row: int | None  # batch row of the request in that step
    stale: bool | None  # whether that row's last input id was spliced in on the device

    def describe(self) -> str:
        where = "" if self.step is None else f" at step {self.step}, row {self.row} ({'stale' if self.stale else 'fresh'} row)"
        return f"token {self.index}: expected {self.expected}, got {self.got}{where}"


@dataclass(frozen=True)
class PathResult:
    """One request on one comparison, e.g. ``async vs sync``."""

    comparison: str
    matched: int
    total: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.matched == self.total


def compare_tokens(comparison: str, reference: Sequence[int], got: RequestOutput) -> PathResult:
    """Score ``got`` against ``reference``; a divergence names the step and row that produced it."""
    tokens, origins = got.token_ids, got.origins
    matched = 0
    while matched < min(len(reference), len(tokens)) and reference[matched] == tokens[matched]:
        matched += 1
    total = len(reference)
    if matched == total and len(tokens) == total:
        return PathResult(comparison, matched, total, None)
    if matched >= len(tokens):  # our path stopped early: nothing sampled to blame
        return PathResult(comparison, matched, total, Divergence(matched, reference[matched], -1, None, None, None))
    origin = origins[matched] if matched < len(origins) else None
    divergence = Divergence(
        index=matched,
        expected=reference[matched] if matched < total else -1,
        got=tokens[matched],
        step=None if origin is None else origin.step,
        row=None if origin is None else origin.row,
        stale=None if origin is None else origin.stale,
    )
    return PathResult(comparison, matched, total, divergence)
