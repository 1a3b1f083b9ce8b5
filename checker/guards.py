"""Branch conditions the analysis understands, and what each branch may then assume.

Two kinds of facts matter for routing:

* **freshness** — under ``inp.device_tokens is None`` (or ``not inp.has_stale_rows``,
  ``not isinstance(inp.device_tokens, DeviceTokens)``, ``not inp.device_tokens``, or a helper
  predicate returning one of these) there are no device ids and no placeholders, so reading host
  ids there is legitimate. The tests evaluate to a :class:`~.values.Flag`, which flows through
  variables, ``not``, ``bool()`` and return values like any other value;
* **narrowing** — under ``isinstance(self.mixer, Mamba2Mixer)`` the attribute holds only the
  matching alternatives, so a hybrid model's per-layer dispatch is not mixed up across layer kinds.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, NamedTuple

from tokenstate.checker.frame import Frame
from tokenstate.checker.values import (
    NONE_WITHOUT_DEVICE_IDS,
    Alt,
    ClassRef,
    External,
    Flag,
    Instance,
    Seq,
    Tokens,
    Value,
    join,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = ["STALE_ROWS", "Facts", "GuardMixin", "expression_path", "facts_of_value", "fresh_row_fact", "is_none_compare", "meet", "never_taken"]


class Facts(NamedTuple):
    """What holds on one side of a condition."""

    fresh: bool
    narrow: dict[str, Value]
    device: bool = False  # the step has device ids on this side: never taken where it has none


_NOTHING = Facts(False, {})


def expression_path(node: ast.expr) -> str | None:
    """``self.mixer`` → ``"self.mixer"``; None for anything but names and attribute chains."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = expression_path(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class GuardMixin:
    def guard(self: Analyzer, frame: Frame, test: ast.expr) -> tuple[Facts, Facts]:
        """Facts when ``test`` is true, and when it is false (the test itself is evaluated)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            when_true, when_false = self.guard(frame, test.operand)
            return when_false, when_true
        if isinstance(test, ast.BoolOp):
            parts = [self.guard(frame, v) for v in test.values]
            conj = isinstance(test.op, ast.And)
            sure = [p[0] if conj else p[1] for p in parts]  # facts of the side where all parts agree
            some = [p[1] if conj else p[0] for p in parts]
            combined = Facts(
                any(f.fresh for f in sure), {k: v for f in sure for k, v in f.narrow.items()}, any(f.device for f in sure)
            )
            either = Facts(all(f.fresh for f in some), {}, all(f.device for f in some))
            return (combined, either) if conj else (either, combined)
        if is_none_compare(test):
            assert isinstance(test, ast.Compare)
            return self.none_compare_facts(frame, test)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In | ast.NotIn):
            row, rows = expression_path(test.left), self.eval(frame, test.comparators[0])
            self.eval(frame, test.left)
            if row is not None and rows == STALE_ROWS:
                # `r in inp.host_tokens.stale_rows`: where it is false, row r's host ids are real
                fresh_row = Facts(False, {fresh_row_fact(row): rows})
                return (_NOTHING, fresh_row) if isinstance(test.ops[0], ast.In) else (fresh_row, _NOTHING)
            return _NOTHING, _NOTHING
        if (
            isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"
            and len(test.args) == 2
        ):
            return self.isinstance_facts(frame, test.args[0], test.args[1])
        if (
            isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is | ast.Eq | ast.IsNot | ast.NotEq)
            and isinstance(call := test.left, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "type"
            and len(call.args) == 1 and not call.keywords
        ):  # `type(child) is DeviceIds`: the subject is an instance of exactly that class
            when_true, when_false = self.isinstance_facts(frame, call.args[0], test.comparators[0], exact=True)
            return (when_true, when_false) if isinstance(test.ops[0], ast.Is | ast.Eq) else (when_false, when_true)
        return facts_of_value(self.eval(frame, test))

    def none_compare_facts(self: Analyzer, frame: Frame, test: ast.Compare) -> tuple[Facts, Facts]:
        left = self.eval(frame, test.left)
        if left == Tokens("device") or NONE_WITHOUT_DEVICE_IDS in getattr(left, "options", (left,)):
            is_none = isinstance(test.ops[0], ast.Is | ast.Eq)
            return Facts(is_none, {}, not is_none), Facts(not is_none, {}, is_none)
        return _NOTHING, _NOTHING

    def isinstance_facts(self: Analyzer, frame: Frame, subject: ast.expr, classes: ast.expr, *, exact: bool = False) -> tuple[Facts, Facts]:
        """``isinstance(subject, classes)`` — or, ``exact``, ``type(subject) is classes`` — narrows
        ``subject`` to the objects that match on the true side and to the others on the false side."""
        path = expression_path(subject)
        value = self.eval(frame, subject)
        wanted = self.eval(frame, classes)
        if value == Tokens("device") and not exact:
            # isinstance(inp.device_tokens, DeviceTokens): true exactly when device ids are present
            options = (wanted.items or ()) if isinstance(wanted, Seq) else (wanted,)
            if any(isinstance(c, External) and c.dotted.rpartition(".")[2] == "DeviceTokens" for c in options):
                return Facts(False, {}, True), Facts(True, {})
            return _NOTHING, _NOTHING
        refs = [c for c in (wanted.items or () if isinstance(wanted, Seq) else (wanted,)) if isinstance(c, ClassRef)]
        if path is None or not refs:
            return _NOTHING, _NOTHING
        infos = {r.info for r in refs}
        matching, other = [], []
        for option in getattr(value, "options", (value,)):
            if isinstance(option, Instance):
                matches = option.info in infos if exact else bool(infos & set(self.mro(option.info)))
                (matching if matches else other).append(option)
            else:  # unknown or external: may or may not be an instance
                matching.append(option)
                other.append(option)
        return Facts(False, {path: join(*matching)}), Facts(False, {path: join(*other)})

    def flag_of(self: Analyzer, frame: Frame, test: ast.expr) -> Flag | None:
        """The test as a value, when it tells whether device ids are present (else None)."""
        when_true, when_false = self.guard(frame, test)
        if when_true.fresh or when_false.fresh:
            return Flag(when_true.fresh, when_false.fresh, when_true.device, when_false.device)
        return None

    def with_facts(self: Analyzer, frame: Frame, facts: Facts) -> tuple[bool, dict[str, Value]]:
        """Apply ``facts`` to ``frame``; returns what to restore."""
        saved = (frame.fresh, frame.narrow)
        frame.fresh = frame.fresh or facts.fresh
        if facts.narrow:
            frame.narrow = {**frame.narrow, **facts.narrow}
        return saved


def never_taken(fresh: bool, side: Facts) -> bool:
    """Whether a side of a branch is never taken on a path with no device ids (``fresh``): it needs
    them (``if inp.device_tokens is not None:`` under a caller's ``is None`` guard)."""
    return fresh and side.device


def meet(outcomes: list[tuple[bool, dict[str, Value]]]) -> tuple[bool, dict[str, Value]]:
    """The facts that hold after a compound statement: those of every path that falls through it
    (``(fresh, narrow)`` at each path's end; facts about the input hold for the whole call, so a
    path keeps what it learnt until the paths meet)."""
    fresh = all(f for f, _ in outcomes)
    first = outcomes[0][1]
    return fresh, {k: v for k, v in first.items() if all(n.get(k) == v for _, n in outcomes[1:])}


STALE_ROWS = Flag(fresh_if_true=False, fresh_if_false=True, device_if_true=True)
"""What ``inp.host_tokens.stale_rows`` (or ``has_stale``) evaluates to: empty exactly when every
host id is fresh; the right side of an ``in`` test, it is the rows with spliced ids."""


def fresh_row_fact(row: str) -> str:
    """The narrowing key of the fact "row ``row`` (an expression path) has no spliced id" (never an
    expression path itself, so no attribute read finds it)."""
    return f"fresh row {row}"


def is_none_compare(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare) and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is | ast.IsNot | ast.Eq | ast.NotEq)
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
    )


def facts_of_value(value: Value) -> tuple[Facts, Facts]:
    """What each side of ``if value:`` may assume about device ids."""
    if isinstance(value, Flag):
        return Facts(value.fresh_if_true, {}, value.device_if_true), Facts(value.fresh_if_false, {}, value.device_if_false)
    if isinstance(value, Alt) and all(isinstance(o, Flag) for o in value.options):
        flags = [o for o in value.options if isinstance(o, Flag)]
        return (
            Facts(all(f.fresh_if_true for f in flags), {}, all(f.device_if_true for f in flags)),
            Facts(all(f.fresh_if_false for f in flags), {}, all(f.device_if_false for f in flags)),
        )
    if value == Tokens("device"):
        return Facts(False, {}, True), Facts(True, {})
    return _NOTHING, _NOTHING
