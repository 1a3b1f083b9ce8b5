"""Statements: flow through assignments, branches (with the device-ids guard), loops and ``with``.

Branches are analysed separately and joined, so a variable after an ``if`` may hold either branch's
value; loop bodies run twice so values carried around the loop (``x = layer(x)``) are seen. A
``with`` block sees what its context manager published, and the publication ends with the block.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tokenstate.checker.evaluate import element_of
from tokenstate.checker.frame import Frame
from tokenstate.checker.guards import Facts
from tokenstate.checker.values import (
    OPAQUE,
    Cell,
    ClassInfo,
    ClassRef,
    Func,
    FuncInfo,
    Instance,
    Seq,
    Tokens,
    Value,
    join,
    taint,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = ["StmtMixin"]


class StmtMixin:
    def exec_block(self: Analyzer, frame: Frame, body: list[ast.stmt]) -> bool:
        """Run ``body``; True when it always leaves the function (return/raise)."""
        return any(self.exec_stmt(frame, stmt) for stmt in body)

    def exec_stmt(self: Analyzer, frame: Frame, stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Return):
            frame.returns.append(OPAQUE if stmt.value is None else self.eval(frame, stmt.value))
            return True
        if isinstance(stmt, ast.Raise):
            if stmt.exc is not None:
                self.eval(frame, stmt.exc)
            return True
        if isinstance(stmt, ast.Expr):
            self.eval(frame, stmt.value)
        elif isinstance(stmt, ast.Assign):
            value = self.eval(frame, stmt.value)
            for target in stmt.targets:
                self.assign(frame, target, value)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.assign(frame, stmt.target, self.eval(frame, stmt.value))
        elif isinstance(stmt, ast.AugAssign):
            current = self.eval(frame, stmt.target) if isinstance(stmt.target, ast.Name) else OPAQUE
            added = self.eval(frame, stmt.value)
            if isinstance(current, Seq) and isinstance(added, Seq):  # list += list
                updated: Value = Seq(None, join(element_of(current), element_of(added)))
            else:
                updated = join(taint(current), taint(added))
            self.assign(frame, stmt.target, updated)
        elif isinstance(stmt, ast.If):
            return self.branch(frame, stmt.test, stmt.body, stmt.orelse)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            element = element_of(self.eval(frame, stmt.iter))
            self.loop(frame, stmt.body, stmt.target, element)
            self.exec_block(frame, stmt.orelse)
        elif isinstance(stmt, ast.While):
            self.eval(frame, stmt.test)
            self.loop(frame, stmt.body, None, OPAQUE)
            self.exec_block(frame, stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            return self.with_block(frame, stmt)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            self.try_block(frame, stmt)
        elif isinstance(stmt, ast.Match):
            self.match_block(frame, stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            info = FuncInfo(frame.module.name, self.local_qualname(frame, stmt.name), stmt.lineno, frame.module.file, stmt)
            scope = {**frame.closure, **frame.env}
            frame.env[stmt.name] = Func(info, None, tuple(sorted(scope.items(), key=lambda kv: kv[0])))
        elif isinstance(stmt, ast.ClassDef):
            info = ClassInfo(frame.module.name, self.local_qualname(frame, stmt.name), stmt.lineno, frame.module.file, stmt)
            frame.env[stmt.name] = ClassRef(info)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                name = alias.name if alias.asname else alias.name.partition(".")[0]
                frame.env[alias.asname or name] = self.module_value(name)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name != "*":
                    bound = alias.asname or alias.name
                    frame.env[bound] = self._resolve_import_from(frame.module, stmt, bound)
        elif isinstance(stmt, ast.Global):
            frame.globals_declared.update(stmt.names)
        elif isinstance(stmt, ast.Assert):
            self.eval(frame, stmt.test)
        return False

    def match_block(self: Analyzer, frame: Frame, stmt: ast.Match) -> None:
        """``match``: each case's captures bind the subject; on ``match inp.device_tokens`` a
        ``case None:`` runs without device ids, and so does any case after a ``case
        DeviceTokens():`` (the guard's other side), as an ``if`` on the same test would."""
        subject = self.eval(frame, stmt.subject)
        on_device = subject == Tokens("device")
        base, states = frame.snapshot(), []
        none_taken = device_taken = False  # an earlier case took every None / every DeviceTokens
        for case in stmt.cases:
            frame.restore(base)
            kind = _device_pattern(case.pattern) if on_device else None
            fresh = kind == "none" or (kind is None and on_device and device_taken and not none_taken)
            saved = self.with_facts(frame, Facts(fresh, {}))
            for name in _captures(case.pattern):
                self.assign(frame, ast.Name(id=name, ctx=ast.Store()), subject)
            if case.guard is not None:
                self.eval(frame, case.guard)
            ends = self.exec_block(frame, case.body)
            frame.fresh, frame.narrow = saved
            if not ends:
                states.append(frame.snapshot())
            none_taken = none_taken or (kind == "none" and case.guard is None)
            device_taken = device_taken or (kind == "device" and case.guard is None)
        frame.merge([base, *states])

    def local_qualname(self: Analyzer, frame: Frame, name: str) -> str:
        return f"{frame.func.qualname}.<locals>.{name}" if frame.func is not None else name

    def branch(self: Analyzer, frame: Frame, test: ast.expr, body: list[ast.stmt], orelse: list[ast.stmt]) -> bool:
        when_true, when_false = self.guard(frame, test)
        base, states, ends = frame.snapshot(), [], []
        for block, facts in ((body, when_true), (orelse, when_false)):
            frame.restore(base)
            saved = self.with_facts(frame, facts)
            ends.append(self.exec_block(frame, block))
            frame.fresh, frame.narrow = saved
            if not ends[-1]:
                states.append(frame.snapshot())
        frame.merge(states or [base])
        # `if device ids are present: return ...` — what follows runs only on the other branch
        if ends[0] != ends[1]:
            self.with_facts(frame, when_false if ends[0] else when_true)
        return all(ends)

    def loop(self: Analyzer, frame: Frame, body: list[ast.stmt], target: ast.expr | None, element: Value) -> None:
        states = [frame.snapshot()]
        for _ in range(2):
            if target is not None:
                self.assign(frame, target, element)
            self.exec_block(frame, body)
            states.append(frame.snapshot())
            frame.merge(states)

    def with_block(self: Analyzer, frame: Frame, stmt: ast.With | ast.AsyncWith) -> bool:
        published, writes = dict(frame.published), dict(frame.writes)
        for item in stmt.items:
            entered = self.enter(frame, self.eval(frame, item.context_expr), item.context_expr)
            if item.optional_vars is not None:
                self.assign(frame, item.optional_vars, entered)
        ends = self.exec_block(frame, stmt.body)
        frame.published, frame.writes = published, writes  # __exit__ withdraws the publication
        return ends

    def try_block(self: Analyzer, frame: Frame, stmt: ast.Try | ast.TryStar) -> None:
        base = frame.snapshot()
        states = [] if self.exec_block(frame, stmt.body) else [frame.snapshot()]
        for handler in stmt.handlers:
            frame.merge([base, *states])
            if handler.name:
                frame.env[handler.name] = OPAQUE
            if not self.exec_block(frame, handler.body):
                states.append(frame.snapshot())
        frame.merge(states or [base])
        self.exec_block(frame, stmt.orelse)
        self.exec_block(frame, stmt.finalbody)

    def assign(self: Analyzer, frame: Frame, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            if target.id in frame.globals_declared:
                frame.write_cell(f"{frame.module.name}.{target.id}", value)
            else:
                frame.env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            starred = any(isinstance(e, ast.Starred) for e in target.elts)
            pairwise = isinstance(value, Seq) and value.items is not None and len(value.items) == len(target.elts)
            for index, elt in enumerate(target.elts):
                part = value.items[index] if pairwise and not starred else element_of(value)  # type: ignore[union-attr, index]
                self.assign(frame, elt, part)
        elif isinstance(target, ast.Starred):
            self.assign(frame, target.value, Seq(None, value))
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id == frame.self_name:
                frame.self_writes[target.attr] = value
                return
            base = self.eval(frame, target.value)
            if isinstance(base, Instance):
                frame.record_writes(base.info, {target.attr: value})
            elif isinstance(base, ClassRef):
                cell = self.class_cell_for(base.info, target.attr)
                if cell is not None:
                    frame.write_cell(cell, value)
            elif isinstance(base, Cell) and base.kind == "local":
                frame.write_cell(f"{base.name}.{target.attr}", value)
        elif isinstance(target, ast.Subscript):
            base = self.eval(frame, target.value)
            self.eval(frame, target.slice)
            if isinstance(base, Cell) and base.kind == "stack":
                frame.write_cell(base.name, value)


def _device_pattern(pattern: ast.pattern) -> str | None:
    """``"none"`` for ``case None:``, ``"device"`` for ``case DeviceTokens():`` (``as`` names
    included), else ``None``."""
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _device_pattern(pattern.pattern)
    if isinstance(pattern, ast.MatchSingleton) and pattern.value is None:
        return "none"
    if isinstance(pattern, ast.MatchClass) and not pattern.patterns and not pattern.kwd_patterns:
        name = pattern.cls.attr if isinstance(pattern.cls, ast.Attribute) else getattr(pattern.cls, "id", "")
        return "device" if name == "DeviceTokens" else None
    return None


def _captures(pattern: ast.pattern) -> list[str]:
    """Names a pattern binds to the whole subject (``case x:``, ``case P() as x:``)."""
    if isinstance(pattern, ast.MatchAs) and pattern.name is not None:
        return [pattern.name]
    return []
