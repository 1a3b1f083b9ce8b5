"""Statements: flow through assignments, branches (with the device-ids guard), loops and ``with``.

Branches are analysed separately and joined, so a variable after an ``if`` may hold either branch's
value; loop bodies run twice so values carried around the loop (``x = layer(x)``) are seen. A
``with`` block sees what its context manager published, and the publication ends with the block.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tokenstate.checker.evaluate import element_of
from tokenstate.checker.frame import (
    RESULT_CACHES,
    Frame,
    buffer_cell,
    cached_cell,
    class_cell,
    closure_cell,
    module_cell,
)
from tokenstate.checker.guards import Facts, fresh_row_fact, meet, never_taken
from tokenstate.checker.values import (
    NO_KEY,
    OPAQUE,
    Alt,
    Cell,
    ClassInfo,
    ClassRef,
    External,
    Func,
    FuncInfo,
    Input,
    Instance,
    MapV,
    ModuleRef,
    Opaque,
    Seq,
    Tokens,
    Unknown,
    Value,
    carries_tokens,
    has_ids,
    join,
    taint,
    with_item,
    without_kept_ids,
)
from tokenstate.checker.views import (
    fetched_attribute,
    is_globals,
    shared_attributes,
    shared_globals,
    viewed,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = ["StmtMixin"]


class StmtMixin:
    def exec_block(self: Analyzer, frame: Frame, body: list[ast.stmt]) -> bool:
        """Run ``body``; True when it always leaves the function (return/raise)."""
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.If) and not _constructing(frame):
                rest = self.unless_set(stmt, body[index + 1:], frame.self_name)
                if rest is not None:
                    return self.exec_stmt(frame, rest)
            if self.exec_stmt(frame, stmt):
                return True
        return False

    def unless_set(self: Analyzer, stmt: ast.If, rest: list[ast.stmt], receiver: str | None) -> ast.If | None:
        """``if self._ready: return`` followed by ``rest`` (an ``_ensure_initialised`` helper), read as
        ``if not self._ready: <rest>`` — a once-only block (see :meth:`branch`) — where the test
        asks that a receiver attribute is set; else None."""
        if stmt not in self._early_returns:
            returns = (
                len(stmt.body) == 1 and isinstance(ret := stmt.body[0], ast.Return) and not stmt.orelse and bool(rest)
                and (ret.value is None or (isinstance(ret.value, ast.Constant) and ret.value.value is None))
            )
            unset = ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=stmt.test), stmt.test)
            once = returns and _created_when_unset(unset, receiver) is not None
            self._early_returns[stmt] = ast.copy_location(ast.If(test=unset, body=list(rest), orelse=[]), stmt) if once else None
        return self._early_returns[stmt]

    def exec_stmt(self: Analyzer, frame: Frame, stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Return):
            frame.returns.append(OPAQUE if stmt.value is None else self.eval(frame, stmt.value))
            frame.return_states.append(frame.snapshot())  # what it wrote before returning is the caller's
            return True
        if isinstance(stmt, ast.Raise):
            if stmt.exc is not None:
                frame.raised.append(self.eval(frame, stmt.exc))
            return True
        if isinstance(stmt, ast.Break | ast.Continue) and frame.loop_exits:
            # Nothing after it in this block runs (so `if device ids: ...; continue` guards the
            # rest of the loop body); its state leaves the block by the loop instead.
            frame.loop_exits[-1].append(frame.snapshot())
            return True
        if isinstance(stmt, ast.Expr):
            self.eval(frame, stmt.value)
        elif isinstance(stmt, ast.Assign):
            value = self.eval(frame, stmt.value)
            for target in stmt.targets:
                self.assign(frame, target, value)
                if isinstance(target, ast.Name):
                    frame.params -= {target.id}  # `dst = dst.clone()`: no longer the caller's object
                    # buf = model.input_ids (or a view of it, np.asarray(model.input_ids)), or
                    # `buf = self.staged = torch.zeros(n)`: buf's fills are the other's
                    if isinstance(named := viewed(stmt.value), ast.Attribute | ast.Name) or (named := _chained_with(stmt, target)) is not None:
                        frame.aliases[target.id] = named
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
            element = self.iterated(self.eval(frame, stmt.iter))
            self.loop(frame, stmt.body, stmt.target, element)
            self.exec_block(frame, stmt.orelse)
        elif isinstance(stmt, ast.While):
            self.eval(frame, stmt.test)
            self.loop(frame, stmt.body, None, OPAQUE)
            self.exec_block(frame, stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            return self.with_block(frame, stmt)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            return self.try_block(frame, stmt)
        elif isinstance(stmt, ast.Match):
            self.match_block(frame, stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            info = FuncInfo(frame.module.name, self.local_qualname(frame, stmt.name), stmt.lineno, frame.module.file, stmt)
            scope = {**frame.closure, **frame.env}
            func = Func(info, None, tuple(sorted(scope.items(), key=lambda kv: kv[0])), raw=frame.func is not None)
            if func.raw:  # a def inside a function: its decorators run here, on this frame's names
                decorators = self.analysed_decorators(stmt, frame.module.name, frame=frame)
                frame.env[stmt.name] = self.apply_decorators(frame, func, decorators, stmt) if decorators else func
            else:
                frame.env[stmt.name] = func
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
        elif isinstance(stmt, ast.Nonlocal):
            frame.nonlocals_declared.update(stmt.names)
        elif isinstance(stmt, ast.Assert):
            self.eval(frame, stmt.test)
        return False

    def match_block(self: Analyzer, frame: Frame, stmt: ast.Match) -> None:
        """``match``: each case's captures bind the subject; on ``match inp.device_tokens`` a
        ``case None:`` runs without device ids, and so does any case after a ``case
        DeviceTokens():`` (the guard's other side), as an ``if`` on the same test would. What
        follows the ``match`` has the facts of every case that falls through, and of matching no
        case at all (no device ids, after an unguarded ``case DeviceTokens():``)."""
        subject = self.eval(frame, stmt.subject)
        on_device = subject == Tokens("device")
        base, states = frame.snapshot(), []
        start = (frame.fresh, frame.narrow)
        outcomes: list[tuple[bool, dict[str, Value]]] = []
        none_taken = device_taken = irrefutable = False  # an earlier case took every None / DeviceTokens / value
        for case in stmt.cases:
            frame.restore(base)
            frame.fresh, frame.narrow = start
            kind = _device_pattern(case.pattern) if on_device else None
            fresh = kind == "none" or (kind is None and on_device and device_taken and not none_taken)
            fresh = fresh or _matches_none_device_tokens(case.pattern, subject)
            self.with_facts(frame, Facts(fresh, {}))
            for name, value in self.pattern_captures(frame, case.pattern, subject).items():
                self.assign(frame, ast.Name(id=name, ctx=ast.Store()), value)
            if case.guard is not None:
                self.eval(frame, case.guard)
            if not self.exec_block(frame, case.body):
                states.append(frame.snapshot())
                outcomes.append((frame.fresh, frame.narrow))
            unguarded = case.guard is None
            none_taken = none_taken or (kind == "none" and unguarded)
            device_taken = device_taken or (kind == "device" and unguarded)
            irrefutable = irrefutable or (unguarded and _irrefutable(case.pattern))
        if not (irrefutable or (none_taken and device_taken)):  # no case may match: the subject stays
            states.append(base)
            outcomes.append((start[0] or (on_device and device_taken), start[1]))
        frame.merge(states or [base])
        frame.fresh, frame.narrow = meet(outcomes) if outcomes else start

    def pattern_captures(self: Analyzer, frame: Frame, pattern: ast.pattern, subject: Value) -> dict[str, Value]:
        """The names ``pattern`` binds, with what each may hold when it matches ``subject``: the
        subject (``case x``), its attributes (``case C(attr=x)``), items (``case (a, *rest)``) or
        values (``case {"k": v}``); a positional class pattern's (``__match_args__``) is unknown."""
        out: dict[str, Value] = {}

        def bind(name: str | None, value: Value) -> None:
            if name is not None:
                out[name] = join(out[name], value) if name in out else value

        def walk(p: ast.pattern, value: Value) -> None:
            if isinstance(p, ast.MatchAs):
                if p.pattern is not None:
                    walk(p.pattern, value)
                bind(p.name, value)
            elif isinstance(p, ast.MatchOr):
                for alternative in p.patterns:
                    walk(alternative, value)
            elif isinstance(p, ast.MatchClass):
                for sub in p.patterns:
                    walk(sub, self.unknown(frame, "a positional class pattern (the class's __match_args__)", p))
                for attr, sub in zip(p.kwd_attrs, p.kwd_patterns, strict=True):
                    walk(sub, self.attribute(frame, value, attr, p))
            elif isinstance(p, ast.MatchSequence):
                star = next((i for i, sub in enumerate(p.patterns) if isinstance(sub, ast.MatchStar)), None)
                known = value.items if isinstance(value, Seq) and star is None else None
                for index, sub in enumerate(p.patterns):
                    if isinstance(sub, ast.MatchStar):
                        bind(sub.name, Seq(None, element_of(value)))
                    elif known is not None and len(known) == len(p.patterns):
                        walk(sub, known[index])
                    else:
                        walk(sub, element_of(value))
            elif isinstance(p, ast.MatchMapping):
                for key, sub in zip(p.keys, p.patterns, strict=True):
                    if not isinstance(value, MapV):
                        walk(sub, taint(value))
                    else:
                        walk(sub, value.lookup(key.value) if isinstance(key, ast.Constant) else value.values)
                bind(p.rest, value)

        walk(pattern, subject)
        return out

    def local_qualname(self: Analyzer, frame: Frame, name: str) -> str:
        return f"{frame.func.qualname}.<locals>.{name}" if frame.func is not None else name

    def branch(self: Analyzer, frame: Frame, test: ast.expr, body: list[ast.stmt], orelse: list[ast.stmt]) -> bool:
        when_true, when_false = self.guard(frame, test)
        base, states, facts = frame.snapshot(), [], []
        start = (frame.fresh, frame.narrow)
        written: list[set[str]] = [set(), set()]  # what each side assigns on the receiver, itself or by a call
        for side, (block, guard_facts) in enumerate(((body, when_true), (orelse, when_false))):
            if never_taken(start[0], guard_facts):  # no device ids on this path: that side is never taken
                continue
            frame.restore(base)
            frame.fresh, frame.narrow = start
            self.with_facts(frame, guard_facts)
            if not self.exec_block(frame, block):
                states.append(frame.snapshot())
                facts.append((frame.fresh, frame.narrow))
                written[side] = _assigned_since(base[3], frame.self_writes)
        frame.merge(states or [base])
        created, side = (_created_when_unset(test, frame.self_name), 0) if not _constructing(frame) else (None, 0)
        if created is None and orelse and not _constructing(frame):  # `if self._ready: ... else: <create>`
            created, side = _created_when_unset(ast.UnaryOp(op=ast.Not(), operand=test), frame.self_name), 1
        once = created is not None and created in frame.self_writes and created not in base[3]
        counter = _counted_from_zero(test, frame.self_name) if not once and frame.func is not None else None
        if counter is not None and not _constructing(frame):  # `if self._step == 0:`, then `self._step += 1`
            once = counter in _counters(frame.func.node, frame.self_name)
        if once:
            # what the branch creates (`self.staged = ...; self._ready = True`, or a helper it calls:
            # `self._setup()`) is created once: each is held as created, see Frame.lazy_fields
            for name in (created, *sorted(written[side])):
                if name in frame.self_writes:
                    # or what an earlier call left there, where the receiver holds it (RCK-76's
                    # second pass: `if self.last is None:` is false once a call kept ids in it)
                    left = frame.self_value.field(name) if isinstance(frame.self_value, Instance) else None
                    frame.lazy_fields[name] = join(frame.self_writes.pop(name), left)
        # What follows runs only after a side that falls through, with what that side learnt:
        # `if device ids are present: return ...` leaves the no-device-ids side, and so does an
        # `elif` chain whose device branch returns.
        frame.fresh, frame.narrow = meet(facts) if facts else start
        return not facts

    def loop(self: Analyzer, frame: Frame, body: list[ast.stmt], target: ast.expr | None, element: Value) -> None:
        states = [frame.snapshot()]
        start = (frame.fresh, frame.narrow)
        frame.loop_exits.append([])
        try:
            for _ in range(2):
                frame.fresh, frame.narrow = start  # each iteration starts at the loop's head
                if target is not None:
                    self.assign(frame, target, element)
                if not self.exec_block(frame, body):
                    states.append(frame.snapshot())
                states.extend(frame.loop_exits[-1])  # `break` and `continue` states
                frame.merge(states)
        finally:
            frame.loop_exits.pop()
        # The loop may run no iteration, or leave by `break` anywhere: only its entry facts hold.
        frame.fresh, frame.narrow = start

    def with_block(self: Analyzer, frame: Frame, stmt: ast.With | ast.AsyncWith) -> bool:
        published, writes = dict(frame.published), dict(frame.writes)
        swallows = False
        for item in stmt.items:
            manager = self.eval(frame, item.context_expr)
            swallows = swallows or self.may_swallow(manager)
            entered = self.enter(frame, manager, item.context_expr)
            if item.optional_vars is not None:
                self.assign(frame, item.optional_vars, entered)
        managed = [cell for cell, value in frame.published.items() if published.get(cell) != value]
        base = frame.snapshot() if swallows else None
        start = (frame.fresh, frame.narrow)
        ends = self.exec_block(frame, stmt.body)
        if base is not None:
            # An exception anywhere in the body may be swallowed: what follows may run from any
            # point of it, with only the facts that held when the block was entered.
            frame.merge([base] if ends else [base, frame.snapshot()])
            frame.fresh, frame.narrow = start
            ends = False
        # __exit__ withdraws what the managers published; what the body kept (a module global, a
        # class attribute) stays
        for cell in managed:
            for now, before in ((frame.published, published), (frame.writes, writes)):
                if cell in before:
                    now[cell] = before[cell]
                else:
                    now.pop(cell, None)
        return ends

    def try_block(self: Analyzer, frame: Frame, stmt: ast.Try | ast.TryStar) -> bool:
        """Handlers may start at any point of the body: they see the state joined over it and only
        the facts that held when the ``try`` was entered. What follows has the facts of every path
        that falls through (the body and its ``else``, and each handler)."""
        base, start = frame.snapshot(), (frame.fresh, frame.narrow)
        raised_before = len(frame.raised)
        states: list[tuple[dict[str, Value], ...]] = []
        outcomes: list[tuple[bool, dict[str, Value]]] = []
        if not self.exec_block(frame, stmt.body):
            body_state = frame.snapshot()
            if not self.exec_block(frame, stmt.orelse):  # the else runs only after the whole body
                states.append(frame.snapshot())
                outcomes.append((frame.fresh, frame.narrow))
        else:
            body_state = frame.snapshot()
        no_device_ids = self.raises_only_without_device_ids(frame, stmt.body)
        for handler in stmt.handlers:
            frame.merge([base, body_state, *states])
            frame.fresh, frame.narrow = start
            if no_device_ids and _catches(handler, EAFP_ERRORS):  # try: inp.device_tokens.ids / except AttributeError
                frame.fresh = True
            if handler.name:  # what the body raised itself (an exception carrying the tokens...)
                frame.env[handler.name] = join(OPAQUE, *frame.raised[raised_before:])
            if not self.exec_block(frame, handler.body):
                states.append(frame.snapshot())
                outcomes.append((frame.fresh, frame.narrow))
        frame.merge(states or [base])
        frame.fresh, frame.narrow = meet(outcomes) if outcomes else start
        return self.exec_block(frame, stmt.finalbody) or not outcomes

    def raises_only_without_device_ids(self: Analyzer, frame: Frame, body: list[ast.stmt]) -> bool:
        """Whether ``body`` is one read of the device ids (``ids = inp.device_tokens.ids``), which
        raises — ``AttributeError`` on ``None`` — exactly when the step has no device ids."""
        if len(body) != 1 or not isinstance(stmt := body[0], ast.Assign | ast.AnnAssign):
            return False
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return (
            isinstance(stmt.value, ast.Attribute) and stmt.value.attr == "ids"
            and self.eval(frame, stmt.value.value) == Tokens("device")
            and all(isinstance(t, ast.Name) for t in targets)  # no attribute write that could raise too
        )

    def assign(self: Analyzer, frame: Frame, target: ast.expr, value: Value) -> None:
        if isinstance(target, ast.Name):
            frame.aliases.pop(target.id, None)  # bound anew: no longer names what it named
            frame.default_cells.pop(target.id, None)
            if frame.partners:  # bound anew: no longer the walk's name or module (empty on most assignments)
                frame.partners = {k: v for k, v in frame.partners.items() if target.id not in (k, v)}
            cell = closure_cell(frame, target.id) if target.id in frame.nonlocals_declared else None
            if target.id in frame.globals_declared:
                frame.write_cell(module_cell(frame, target.id), value)
            elif cell is not None:  # a closure's enclosing variable: it outlives this call
                frame.write_cell(cell, value)
            else:
                frame.env[target.id] = value
            if fresh_row_fact(target.id) in frame.narrow:  # another row now: what held of the old one does not
                frame.narrow = {k: v for k, v in frame.narrow.items() if k != fresh_row_fact(target.id)}
        elif isinstance(target, ast.Tuple | ast.List):
            value = self.record_items(value) or value  # a, b = meta: a NamedTuple's fields in order
            value = _position_wise(value, len(target.elts)) or value
            starred = any(isinstance(e, ast.Starred) for e in target.elts)
            pairwise = isinstance(value, Seq) and value.items is not None and len(value.items) == len(target.elts)
            for index, elt in enumerate(target.elts):
                part = value.items[index] if pairwise and not starred else element_of(value)  # type: ignore[union-attr, index]
                self.assign(frame, elt, part)
            if pairwise and not starred and _names_a_submodule(target.elts, value.items):  # type: ignore[union-attr, arg-type]
                frame.partners[target.elts[0].id] = target.elts[1].id  # type: ignore[attr-defined]
        elif isinstance(target, ast.Starred):
            self.assign(frame, target.value, Seq(None, value))
        elif isinstance(target, ast.Attribute):
            # An object's attribute outlives the call (the model's does): what is fresh in this call
            # is not in the next one that reads it back. This call's own later reads are in this
            # call; the writes go stale where a summary hands them out and on a path that did not
            # make them (Frame.merge).
            if isinstance(target.value, ast.Name) and target.value.id == frame.self_name:
                frame.self_writes[target.attr] = value
                return
            base = self.eval(frame, target.value)
            if isinstance(base, Instance):
                frame.record_writes(base.info, {target.attr: value})
            elif isinstance(base, ModuleRef):
                self.write_module_global(frame, base, target.attr, value)
            elif isinstance(base, ClassRef):  # a class attribute: a scope cell, as a module global is
                frame.write_cell(self.class_cell_for(base.info, target.attr) or class_cell(base.info, target.attr), value)
            elif isinstance(base, Cell) and base.kind == "local":
                frame.write_cell(f"{base.name}.{target.attr}", value)
            elif isinstance(base, Alt) and any(isinstance(o, Instance) for o in base.options):
                # `for m in model.modules(): m.source = HostIds()`: each object it may be may now hold it
                for option in base.options:
                    if isinstance(option, Instance):
                        frame.record_writes(option.info, {target.attr: join(self.current(frame, option).field(target.attr), value)})
                    else:
                        self.stored_out_of_sight(frame, option, value, target)
            else:
                self.stored_out_of_sight(frame, base, value, target)
        elif isinstance(target, ast.Subscript):
            spelt = self.assignment_spelt(frame, target)
            if spelt is not None:  # globals()["KEPT"] = v, obj.__dict__["ids"] = v: the assignment it spells
                if isinstance(spelt, ast.Name):
                    frame.write_cell(module_cell(frame, spelt.id), value)
                else:
                    self.assign(frame, spelt, value)
                return
            owner = _namespace_owner(target.value)
            if owner is not None and self.replaced_by_a_computed_name(frame, owner, self.eval(frame, owner), target.slice, value):
                return
            base = self.eval(frame, target.value)
            self.eval(frame, target.slice)
            if isinstance(base, Cell) and base.kind == "stack":
                frame.write_cell(base.name, value)
            elif all(isinstance(o, MapV | Seq) for o in getattr(base, "options", (base,))) and isinstance(
                target.value, ast.Name | ast.Attribute
            ):
                keys = self.key_choices(frame, target.slice)
                filled = join(*(_with_key(o, keys, value) for o in getattr(base, "options", (base,))))
                self.fill_in_place(frame, target.value, filled)  # the container (each one it may be), filled
            elif has_ids(value):
                self.write_into(frame, target.value, value)  # buf[:n] = ids: a tensor filled in place
            else:
                self.stored_out_of_sight(frame, base, value, target)

    def write_module_global(self: Analyzer, frame: Frame, module: ModuleRef, name: str, value: Value) -> None:
        """``state.KEPT = v`` (and ``setattr(state, "KEPT", v)``, ``vars(state)["KEPT"] = v``): the
        module's global ``KEPT``, a scope cell as a ``global KEPT`` write in that module is — kept
        beyond the call, read back by ``state.KEPT`` and by ``KEPT`` inside the module."""
        cell = f"{module.name}.{name}"
        self.globals_written_through_modules.add(cell)
        frame.write_cell(cell, value)

    def assignment_spelt(self: Analyzer, frame: Frame, target: ast.Subscript) -> ast.Name | ast.Attribute | None:
        """The plain assignment target an item write into a namespace spells, where its key is a
        fixed string: ``globals()["KEPT"]`` is the module global ``KEPT`` (a name some function
        writes as ``global KEPT`` would be: :func:`~tokenstate.checker.sources.global_names_spelt`);
        ``obj.__dict__["ids"]``, ``vars(obj)["ids"]`` and ``module._modules["ids"]`` are ``obj.ids``, and on a module
        (``vars(state)["K"]``, ``sys.modules[__name__].__dict__["K"]``) its global ``state.K``."""
        namespace = target.value
        owner = (namespace if frame.func is not None else None) if is_globals(namespace) else _namespace_owner(namespace)
        # the name is looked for only under a namespace: a key's bindings are read off the function
        keys = self.constant_names(frame, target.slice) if owner is not None else None
        if keys is None or len(keys) != 1:
            return None
        if owner is namespace:  # globals()
            return ast.copy_location(ast.Name(id=keys[0], ctx=ast.Store()), target)
        if isinstance(self.eval(frame, owner), Instance | ModuleRef):  # vars(state)["K"] is state.K
            return ast.copy_location(ast.Attribute(value=owner, attr=keys[0], ctx=ast.Store()), target)
        return None

    def write_into(self: Analyzer, frame: Frame, expr: ast.expr, value: Value) -> None:
        """Ids written into (part of) the tensor ``expr`` names — ``buf[:n] = ids``,
        ``buf[:n].copy_(ids)``: the variable or attribute holding it holds them from now on, as
        an attribute assignment would (vLLM's persistent input buffers)."""
        expr = viewed(expr)  # buf[:n], buf.narrow(0, 0, n), buf.numpy()...: (a part of) the memory buf names
        if isinstance(expr, ast.Call):  # step_buffer(n)[:k] = ids, the object a cached factory hands out
            factory = self.eval(frame, expr.func)
            if isinstance(factory, Func) and self.decorators(factory) & RESULT_CACHES:
                cell = cached_cell(factory.info)
                frame.write_cell(cell, join(frame.published.get(cell), taint(value)))
            return
        if isinstance(expr, ast.Name | ast.Attribute):
            self.fill_in_place(frame, expr, join(without_kept_ids(self.eval(frame, expr)), taint(value)), tensor=True)

    def fill_in_place(self: Analyzer, frame: Frame, expr: ast.Name | ast.Attribute, value: Value, *, tensor: bool = False) -> None:
        """The object ``expr`` names — a tensor, a list, a dict — now holds ``value``, filled in
        place. A module-level one (``_INPUT_IDS[:n].copy_(ids)``, ``_LAST[0] = ids``, imported or
        reached as ``module.NAME``) keeps what it is given across calls: a scope cell, as a name
        declared ``global`` is; any other is (re)assigned where it is named. A ``tensor`` filled
        with ids is also the tensor a local alias names (``buf = model.input_ids``) and the
        caller's, when it is a parameter (``copy_into(model.input_ids, ids)``)."""
        # only what carries tokens or ids: a scope cell is part of every later call's context (a
        # registry dict filled at import-like time would make each call a new one to analyse)
        variable = self.filled_variable(frame, expr) if carries_tokens(value) else None
        if variable is not None:
            module, _, name = variable.rpartition(".")
            for sharing in self.sharing_globals(module).get(name, {name}):  # IDS_NP = IDS.numpy(): both hold them
                frame.write_cell(buffer_cell(f"{module}.{sharing}"), value)
            return
        aliased = frame.aliases.get(expr.id) if tensor and isinstance(expr, ast.Name) else None
        shared = frame.default_cells.get(expr.id) if isinstance(expr, ast.Name) else None
        captured = self.captured_cell(frame, expr)
        if captured is not None:  # a closure's captured object, filled: it outlives the call
            frame.write_cell(captured, value)
            return
        self.assign(frame, expr, value)
        if shared is not None:  # def f(..., seen=[]): seen.append(ids) fills the one default list
            frame.default_cells[expr.id] = shared
            frame.write_cell(shared, value)
        if tensor and isinstance(expr, ast.Attribute):
            self.fill_sharing_attributes(frame, expr, value)
        if tensor and isinstance(expr, ast.Name):
            if aliased is not None:  # buf = model.input_ids; buf[:n].copy_(ids): the model's buffer holds them
                frame.aliases[expr.id] = aliased
                self.fill_in_place(frame, aliased, join(without_kept_ids(self.eval(frame, aliased)), value), tensor=True)
            elif frame.func is not None and expr.id in frame.params:  # a caller's tensor, filled here
                frame.param_fills[expr.id] = join(frame.param_fills.get(expr.id), value)

    def captured_cell(self: Analyzer, frame: Frame, expr: ast.Name | ast.Attribute) -> str | None:
        """The scope cell of the enclosing function's object ``expr`` names in a closure (``buf``
        captured by the inner def), which a fill in place changes for every later call."""
        if isinstance(expr, ast.Name) and expr.id in frame.closure and expr.id not in frame.env:
            return closure_cell(frame, expr.id)
        return None

    def fill_sharing_attributes(self: Analyzer, frame: Frame, expr: ast.Attribute, value: Value) -> None:
        """Attribute ``expr`` was filled with ``value``: so were the attributes sharing its memory,
        as the class of each analysed object along the chain binds them (``self.ids_np =
        self.ids.numpy()``, vLLM's ``CpuGpuBuffer.np``, ``self.ids_np = self.buf.cpu.numpy()``)."""
        names: list[str] = []
        base: ast.expr = expr
        while isinstance(base, ast.Attribute) and len(names) < _NESTING:
            names.insert(0, base.attr)
            base = base.value
            owner = self.eval(frame, base)
            if not isinstance(owner, Instance):
                continue
            path = ".".join(names)
            for sharing in self.sharing_attributes(owner.info).get(path, ()):
                if sharing == path:
                    continue
                *through, last = sharing.split(".")
                holder = base
                for name in through:
                    holder = ast.copy_location(ast.Attribute(value=holder, attr=name, ctx=ast.Load()), expr)
                view = ast.copy_location(ast.Attribute(value=holder, attr=last, ctx=ast.Load()), expr)
                held_by = self.eval(frame, holder) if through else owner
                held = self.eval(frame, view) if isinstance(held_by, Instance) and self.attribute_is_set(frame, held_by, last) else None
                self.assign(frame, view, join(None if held is None else without_kept_ids(held), value))

    def attribute_is_set(self: Analyzer, frame: Frame, owner: Instance, name: str) -> bool:
        return owner.field(name) is not None or (owner == frame.self_value and name in frame.self_writes) or (
            name in frame.obj_writes.get(owner.info, {})
        )

    def sharing_attributes(self: Analyzer, cls: ClassInfo) -> dict[str, frozenset[str]]:
        """Attribute path (``"ids_np"``, ``"buf.cpu"``) -> the paths on ``cls``'s instances sharing
        its memory, as the methods of ``cls`` and its analysed bases assign them."""
        found = self._sharing_attributes.get(cls)
        if found is None:
            methods = [
                stmt for klass in self.mro(cls) if isinstance(klass, ClassInfo)
                for stmt in klass.node.body if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            found = self._sharing_attributes[cls] = shared_attributes(methods)
        return found

    def sharing_globals(self: Analyzer, module: str) -> dict[str, frozenset[str]]:
        """Module-level name -> the module-level names of ``module`` sharing its memory."""
        found = self._sharing_globals.get(module)
        if found is None:
            info = self.load_module(module)
            found = self._sharing_globals[module] = {} if isinstance(info, Unknown) else shared_globals(info.tree)
        return found

    def stored_out_of_sight(self: Analyzer, frame: Frame, base: Value, value: Value, node: ast.AST) -> None:
        """The forward input, its tokens or token ids stored on an object the checker does not model
        (an external one: ``types.SimpleNamespace()``, a config; a model whose class a decorator
        rebuilt): read back later out of sight, so an unresolved ``unknown`` route, never an inert one."""
        if isinstance(base, External | Opaque | Unknown) and (
            any(isinstance(v, Input | Tokens) for v in getattr(value, "options", (value,))) or has_ids(value)
        ):
            self.unresolved(frame, self.unknown(frame, "stores the forward input or token ids on an object the checker does not model", node), node)


def _position_wise(value: Value, length: int) -> Seq | None:
    """Tuples of ``length`` items that ``value`` may be (a pair from any of several modules' walks),
    as one tuple whose each position may be what any of them holds there; else None."""
    options = getattr(value, "options", None)
    if not options or not all(isinstance(o, Seq) and o.items is not None and len(o.items) == length for o in options):
        return None
    return Seq(tuple(join(*(o.items[i] for o in options)) for i in range(length)), join(*(o.elem for o in options)))


def _names_a_submodule(targets: list[ast.expr], parts: tuple[Value, ...]) -> bool:
    """Whether ``name, child = pair`` binds a walk's pair (``named_children()``, ``named_modules()``):
    two names, the second bound to analysed objects, the first to a name of no value here."""
    return (
        len(targets) == 2 and all(isinstance(t, ast.Name) for t in targets) and parts[0] == OPAQUE
        and any(isinstance(o, Instance) for o in getattr(parts[1], "options", (parts[1],)))
    )


def _namespace_owner(namespace: ast.expr) -> ast.expr | None:
    """The object whose attribute table ``namespace`` is — ``obj`` of ``obj.__dict__``,
    ``module._modules`` or ``vars(obj)`` — else None."""
    if isinstance(namespace, ast.Call) and isinstance(namespace.func, ast.Name) and not namespace.keywords:
        return namespace.args[0] if namespace.func.id == "vars" and len(namespace.args) == 1 else None
    return namespace.value if isinstance(namespace, ast.Attribute) and namespace.attr in NAMESPACES else None


CONSTRUCTORS = frozenset({"__init__", "__new__", "__post_init__"})
NAMESPACES = frozenset({"__dict__", "_modules", "_buffers", "_parameters"})
"""Attributes of an object that map its attribute names to their values: ``obj.__dict__["a"] = v``
and ``module._modules["embed"] = m`` (``nn.Module``'s own tables) are ``obj.a = v``."""
_NESTING = 3
"""How many attributes deep a fill is matched against the paths that share its memory."""


def _constructing(frame: Frame) -> bool:
    """Whether ``frame`` is a constructor's (``__init__``, ``__post_init__``...), where every
    attribute is created and an ``if self.a is None:`` default is simply what the object holds."""
    return frame.func is not None and frame.func.qualname.rpartition(".")[2] in CONSTRUCTORS


def _created_when_unset(test: ast.expr, receiver: str | None) -> str | None:
    """The attribute of ``receiver`` that ``test`` asks is not set yet — ``not hasattr(self, "a")``,
    ``getattr(self, "a", None) is None``, a flag (``not self._ready``, ``not getattr(self, "_ready",
    False)``, ``self._ready is False``, ``== False``, ``is not True``, ``not
    self.__dict__.get("_ready")``), ``self.a is None``, ``"a" not in self.__dict__`` (or
    ``self._buffers``, ``vars(self)``), or still empty (``self.a.numel() == 0``, ``not len(self.a)``)
    — also as one part of an ``and`` / ``or`` — so that the branch creates it lazily; else None."""
    def on_receiver(node: ast.expr) -> bool:
        return _is_receiver(node, receiver)

    def named(node: ast.expr) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    if isinstance(test, ast.BoolOp):  # `self.buf is None or too small`, `not self._ready and enabled`
        return next((name for part in test.values if (name := _created_when_unset(part, receiver)) is not None), None)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        asked = _unwalrused(test.operand)  # `not (ready := self._ready)`
        if (flag := _flag_read(asked, receiver)) is not None:  # `not self._ready`, `not getattr(self, "_ready", False)`
            return flag
        if (emptied := _sized(asked, receiver)) is not None:  # `not self.staged.numel()`
            return emptied
        if (isinstance(asked, ast.Call) and isinstance(asked.func, ast.Name) and asked.func.id == "hasattr"
                and len(asked.args) == 2 and on_receiver(asked.args[0])):  # `not hasattr(self, "staged")`
            return named(asked.args[1])
        return None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    left = _unwalrused(left)  # `(buf := getattr(self, "staged", None)) is None`
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and right.value == 0 and type(right.value) is int:
        if (emptied := _sized(left, receiver)) is not None:  # `self.staged.numel() == 0`
            return emptied
    if isinstance(right, ast.Constant) and (
        (isinstance(op, ast.Is | ast.Eq) and right.value is False) or (isinstance(op, ast.IsNot | ast.NotEq) and right.value is True)
    ):  # `self._ready is False`, `getattr(self, "_ready", None) is not True`
        return _flag_read(left, receiver)
    if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value is None:
        if (attribute := _receiver_attribute(left, receiver)) is not None:
            return attribute
        if (isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "getattr"
                and len(left.args) == 3 and on_receiver(left.args[0])):
            return named(left.args[1])
    if isinstance(op, ast.NotIn) and (name := named(left)) is not None:
        if isinstance(right, ast.Attribute) and right.attr in NAMESPACES and on_receiver(right.value):
            return name
        if (isinstance(right, ast.Call) and isinstance(right.func, ast.Name) and right.func.id == "vars"
                and len(right.args) == 1 and on_receiver(right.args[0])):
            return name
    return None


def _is_receiver(node: ast.expr, receiver: str | None) -> bool:
    """Whether ``node`` is the method's receiver (``self``)."""
    return receiver is not None and isinstance(node, ast.Name) and node.id == receiver


def _receiver_attribute(node: ast.expr, receiver: str | None) -> str | None:
    """``a`` where ``node`` is ``self.a`` on the method's receiver, else None."""
    return node.attr if isinstance(node, ast.Attribute) and _is_receiver(node.value, receiver) else None


def _chained_with(stmt: ast.Assign, target: ast.Name) -> ast.Attribute | ast.Name | None:
    """Another target of a chained assignment (``buf = self.staged = torch.zeros(n)``): the same
    object as ``target``; else None."""
    return next((t for t in stmt.targets if t is not target and isinstance(t, ast.Attribute | ast.Name)), None)


def _unwalrused(expr: ast.expr) -> ast.expr:
    """What ``(name := expr)`` tests: ``expr``; any other expression as it is."""
    return expr.value if isinstance(expr, ast.NamedExpr) else expr


def _flag_read(node: ast.expr, receiver: str | None) -> str | None:
    """The attribute of ``receiver`` that ``node`` reads as a flag — ``self._ready``,
    ``getattr(self, "_ready"[, default])``, ``self.__dict__.get("_ready"[, default])``,
    ``vars(self).get("_ready")`` — else None."""
    attribute = node if isinstance(node, ast.Attribute) else fetched_attribute(node)
    if attribute is not None:
        return _receiver_attribute(attribute, receiver)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and not node.keywords and len(node.args) in (1, 2)):
        return None
    table = node.func.value  # self.__dict__.get("_ready"), vars(self).get("_ready")
    own_table = (isinstance(table, ast.Attribute) and table.attr == "__dict__" and _is_receiver(table.value, receiver)) or (
        isinstance(table, ast.Call) and isinstance(table.func, ast.Name) and table.func.id == "vars" and len(table.args) == 1
        and _is_receiver(table.args[0], receiver)
    )
    key = node.args[0]
    return key.value if own_table and isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _sized(node: ast.expr, receiver: str | None) -> str | None:
    """The attribute of ``receiver`` whose size ``node`` asks — ``self.a.numel()``,
    ``self.a.nelement()``, ``len(self.a)`` — else None."""
    if not (isinstance(node, ast.Call) and not node.keywords):
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("numel", "nelement") and not node.args:
        sized = node.func.value
    elif isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1:
        sized = node.args[0]
    else:
        return None
    return _receiver_attribute(sized, receiver)


def _counted_from_zero(test: ast.expr, receiver: str | None) -> str | None:
    """The attribute of ``receiver`` that ``test`` asks is still zero — ``self._step == 0``,
    ``0 == self._step``, ``self._step < 1``, ``not self._step`` — else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _receiver_attribute(test.operand, receiver)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Lt):
        left, op, right = test.left, test.ops[0], test.comparators[0]
        bound = 0 if isinstance(op, ast.Eq) else 1
        if isinstance(right, ast.Constant) and right.value == bound and type(right.value) is int:
            return _receiver_attribute(left, receiver)
        if isinstance(op, ast.Eq) and isinstance(left, ast.Constant) and left.value == 0 and type(left.value) is int:
            return _receiver_attribute(right, receiver)
    return None


def _counters(func: ast.AST, receiver: str | None) -> set[str]:
    """The attributes of ``receiver`` that ``func`` only ever counts up (``self._step += 1``): once
    non-zero, a test that they are zero stays false."""
    up, other = set(), set()
    for node in ast.walk(func):
        counts = (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.value, ast.Constant)
                  and type(node.value.value) is int and node.value.value > 0)
        (up if counts else other).update(_receiver_targets(node, receiver))
    return up - other


def _assigned_since(before: dict[str, Value], after: dict[str, Value]) -> set[str]:
    """The receiver's attributes a block assigned that were not assigned before it (the block's own
    ``self.staged = ...`` and ``register_buffer("staged", ...)``, and those a method it calls assigns)."""
    return set(after) - set(before)


def _receiver_targets(node: ast.AST, receiver: str | None) -> list[str]:
    """The attributes of ``receiver`` that assignment ``node`` (plain, annotated or augmented) assigns."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
    return [name for t in targets if (name := _receiver_attribute(t, receiver)) is not None]


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


def _matches_none_device_tokens(pattern: ast.pattern, subject: Value) -> bool:
    """Whether a case matches only where there are no device ids, by a ``None`` at the position of
    ``inp.device_tokens`` in a tuple subject: ``match (inp.device_tokens, x): case (None, y):``."""
    while isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        pattern = pattern.pattern
    if not (isinstance(pattern, ast.MatchSequence) and isinstance(subject, Seq) and subject.items is not None):
        return False
    if any(isinstance(p, ast.MatchStar) for p in pattern.patterns) or len(pattern.patterns) != len(subject.items):
        return False
    return any(
        _device_pattern(p) == "none" if item == Tokens("device") else _matches_none_device_tokens(p, item)
        for p, item in zip(pattern.patterns, subject.items, strict=True)
    )


def _with_key(container: MapV | Seq, keys: tuple[object, ...] | None, value: Value) -> MapV | Seq:
    """``container[key] = value`` for a key that may be any of ``keys`` (``None``: unknown)."""
    if keys is None or len(keys) == 1:
        return with_item(container, NO_KEY if keys is None else keys[0], value)
    filled = container  # kwargs[name] = v in a loop over names: each may hold v, or what it held
    for key in keys:
        previous = container.lookup(key) if isinstance(container, MapV) else element_of(container)
        filled = with_item(filled, key, join(previous, value))
    return filled


def _irrefutable(pattern: ast.pattern) -> bool:
    """``case _:`` / ``case x:`` (and ``|`` patterns holding one) match every subject."""
    if isinstance(pattern, ast.MatchAs):
        return pattern.pattern is None or _irrefutable(pattern.pattern)
    if isinstance(pattern, ast.MatchOr):
        return any(_irrefutable(p) for p in pattern.patterns)
    return False


EAFP_ERRORS = frozenset({"AttributeError", "Exception", "BaseException"})
"""Handlers that catch what ``None.ids`` raises (a bare ``except:`` does too)."""


def _catches(handler: ast.ExceptHandler, names: frozenset[str]) -> bool:
    """Whether ``handler`` catches one of the builtin exceptions ``names`` (bare, a name, a tuple)."""
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in names for k in kinds)
