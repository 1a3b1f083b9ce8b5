"""Verdicts, routes and findings of the routing checker, with stable text and JSON renderings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["CheckReport", "EntryResult", "EntryTarget", "Hop", "Route", "Verdict"]


class Verdict(StrEnum):
    """Classification of one registered forward."""

    HONORS = "honors"  # every route that embeds token ids reads device tokens or a published scope
    IGNORES = "ignores"  # some route reads host ids (to embed or otherwise) while device ids may be present
    INERT = "inert"  # no route embeds token ids (pooling, ...)
    UNKNOWN = "unknown"  # a route depends on something the analysis cannot resolve


@dataclass(frozen=True)
class EntryTarget:
    """A registered forward to check, located by source (nothing is imported to analyse it).

    Attributes:
        name: display name (the factory's name).
        module: the module defining the forward (``fn.__module__``).
        qualname: the forward's qualified name in that module.
        declared: the factory's ``honors_device_token_ids`` (``None`` when checking bare source).
        model_module / model_qualname: a function (the factory's ``build``) whose return value
            gives the model's class when the forward's ``model`` parameter is not annotated.
    """

    name: str
    module: str
    qualname: str
    declared: bool | None = None
    model_module: str | None = None
    model_qualname: str | None = None


@dataclass(frozen=True, order=True)
class Hop:
    """One step of a route: ``function`` at ``file:line`` (the call to the next hop, or the sink)."""

    function: str
    file: str
    line: int

    def render(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True)
class Route:
    """A way from the entry point to an embedding (or to something the analysis could not follow).

    ``kind`` is ``honors`` / ``ignores`` / ``unknown``; ``sink`` names the embedding; ``source``
    says where its ids were read (or why they are unknown), with file:line.
    """

    kind: str
    hops: tuple[Hop, ...]
    sink: str
    source: str

    def render(self) -> str:
        chain = " → ".join(hop.render() for hop in self.hops)
        return f"{chain}: {self.sink} ← {self.source}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "chain": [{"function": h.function, "file": h.file, "line": h.line} for h in self.hops],
            "sink": self.sink,
            "source": self.source,
        }


@dataclass
class EntryResult:
    """The checker's answer for one entry point."""

    entry: str
    function: str
    file: str
    line: int
    declared: bool | None
    verdict: Verdict
    routes: list[Route] = field(default_factory=list)
    error: str | None = None

    @property
    def finding(self) -> str | None:
        """Why this entry point needs attention, or ``None``."""
        if self.error is not None:
            return self.error
        if self.verdict is Verdict.IGNORES:
            return (
                "reads host token ids (to embed them or for anything else) where device ids may be "
                "present — StaleHostTokensError or placeholders on the async path; read "
                "inp.device_tokens.ids / inp.embedding_ids(), take metadata from the forward input "
                "(inp.num_tokens, inp.logit_rows...), or guard the read with inp.device_tokens is None."
            )
        if self.verdict is Verdict.UNKNOWN:
            return (
                "an embedding route could not be resolved statically; make the dispatch static "
                "(plain calls, annotated model parameter) so the checker can follow it."
            )
        if self.verdict is Verdict.HONORS and self.declared is False:
            return (
                "honors device token ids but its factory declares honors_device_token_ids=False; "
                "declare True so the runner stops falling back to the synchronous path."
            )
        return None

    @property
    def note(self) -> str | None:
        """Something to look at that is not a finding: a forward declared honouring in which the
        checker found no embedding of token ids at all. A forward that embeds none (pooling over
        positions) is fine; one that does embed ids does it in a way the checker does not see."""
        if self.verdict is Verdict.INERT and self.declared is True:
            return (
                "declared honouring, but no route embeds token ids: right for a forward that embeds "
                "none; if this one does, the checker cannot see how (run `tokenstate gate` on it)."
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "declared": self.declared,
            "verdict": self.verdict.value,
            "finding": self.finding,
            "note": self.note,
            "routes": [r.to_json() for r in self.routes],
        }


@dataclass
class CheckReport:
    """All entry points of one run, in the order given."""

    results: list[EntryResult]

    @property
    def findings(self) -> list[EntryResult]:
        return [r for r in self.results if r.finding is not None]

    def by_entry(self) -> dict[str, EntryResult]:
        return {r.entry: r for r in self.results}

    def to_json(self) -> str:
        payload = {
            "entry_points": len(self.results),
            "findings": len(self.findings),
            "results": [r.to_json() for r in self.results],
        }
        return json.dumps(payload, indent=2, sort_keys=True)

    def render(self) -> str:
        lines = []
        for r in self.results:
            declared = {None: "an @entry_point forward, not registered", True: "declared honors",
                        False: "declared not honoring"}[r.declared]
            mark = "FINDING" if r.finding else "ok"
            lines.append(f"[{mark}] {r.entry}: {r.verdict.value} ({declared}) — {r.file}:{r.line}")
            if r.finding:
                lines.append(f"    {r.finding}")
                shown = [x for x in r.routes if x.kind != "honors"] or r.routes
                lines += [f"    route: {route.render()}" for route in shown]
            elif r.note:
                lines.append(f"    note: {r.note}")
        lines.append(f"{len(self.results)} entry point(s) checked, {len(self.findings)} finding(s).")
        return "\n".join(lines)
