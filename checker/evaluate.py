"""Expressions: what value each may hold, with the token-id sources of ``ForwardInput`` built in.

Sources of ids (the contract of ``tokenstate.contracts``):

* ``inp.device_tokens.ids`` and ``inp.embedding_ids()`` — device ids (honour the contract);
* ``inp.host_tokens.ids`` / ``.row_ids(r)`` — host ids: *fresh* on a path guarded by
  ``inp.device_tokens is None`` or ``not inp.has_stale_rows`` (see :mod:`.guards`), otherwise
  possibly placeholders;
* ``inp.host_tokens.placeholder_buffer()`` — the raw host buffer, never fit to embed.

Outside a freshness guard, *reading* host ids is itself a finding, whatever the ids are used for
(an embedding, a penalty, a bias table, ``len()``, logging): ``HostTokens.ids`` raises on a step
with spliced rows, and the raw buffer holds placeholders there. Only metadata that never touches
ids (``inp.num_tokens``, ``inp.host_tokens.stale``...) is free.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING

from tokenstate.checker.frame import Frame, class_cell, closure_cell, module_cell
from tokenstate.checker.guards import (
    STALE_ROWS,
    Facts,
    expression_path,
    is_none_compare,
    never_taken,
)
from tokenstate.checker.sources import ModuleInfo
from tokenstate.checker.values import (
    METADATA_ATTRS,
    OPAQUE,
    RECORD_METHODS,
    RETURNS_SELF,
    SUBMODULE_PATHS,
    SUBMODULE_WALKS,
    Bound,
    Cell,
    ClassInfo,
    ClassRef,
    External,
    Flag,
    Func,
    FuncInfo,
    Ids,
    Input,
    Instance,
    MapV,
    ModuleRef,
    Opaque,
    Origin,
    Seq,
    Super,
    Tokens,
    Unknown,
    Value,
    has_ids,
    join,
    stored_beyond_the_call,
    taint,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = ["STALE_TESTS", "STATE_DUMPS", "ExprMixin", "element_of", "host_kind"]

STALE_TESTS = frozenset({"has_stale", "stale_rows"})
"""``HostTokens`` attributes that are false (or empty) exactly when every host id is fresh."""
STALE_MASK = Bound(Tokens("host"), "stale")
"""``inp.host_tokens.stale``, the per-position mask: its ``any()`` is false exactly when every host id
is fresh."""
MASK_TESTS = frozenset({"any", "item"})


def is_stale_test(base: Value, name: str) -> bool:
    """Whether method ``name`` of ``base`` is a stale-rows test: ``inp.host_tokens.stale.any()``
    (or ``.item()``), and ``.item()`` of such a test."""
    return (base == STALE_MASK and name in MASK_TESTS) or (base == STALE_ROWS and name == "item")


STATE_DUMPS = frozenset({"__getstate__", "__reduce__", "__reduce_ex__"})
"""Methods that hand out an object's state: on ``HostTokens``, the raw buffer among it."""


def host_kind(frame: Frame, tokens: Tokens) -> str:
    """The kind of a read of host tokens' ids: fresh under a no-device-ids fact of this frame, or
    where the tokens themselves were taken under one."""
    return "host_fresh" if frame.fresh or tokens.fresh else "host"


class Given(ast.expr):
    """An expression standing for a value already known: an item of a loop evaluated before its
    body is read (``for cls in MODELS + EXTRA: cls.ids_for = ...``), put where the loop's name was."""

    _fields = ()

    def __init__(self, value: Value = OPAQUE) -> None:  # the default: copy.deepcopy builds it bare
        super().__init__()
        self.value = value


def element_of(value: Value) -> Value:
    """What iterating over ``value`` gives."""
    if isinstance(value, Seq):
        return join(*(value.items or ()), value.elem)
    if isinstance(value, MapV):
        return OPAQUE  # iterating a dict gives its keys
    if isinstance(value, Cell) and value.kind == "stack":
        return value
    if hasattr(value, "options"):
        return join(*(element_of(v) for v in value.options))  # type: ignore[attr-defined]
    return taint(value)


def negate(value: Value) -> Value:
    """``not value``: a device-ids flag swaps its sides; anything else is plain data."""
    if isinstance(value, Flag):
        return value.negated()
    if hasattr(value, "options") and any(isinstance(o, Flag) for o in value.options):  # type: ignore[attr-defined]
        return join(*(negate(o) for o in value.options))  # type: ignore[attr-defined]
    return OPAQUE


def _sliced(base: Seq, part: ast.Slice) -> Seq:
    """``base[a:b:c]``: the items it keeps where the bounds are integer literals, else any of them."""
    bounds = (part.lower, part.upper, part.step)
    literal = all(b is None or (isinstance(b, ast.Constant) and type(b.value) is int) for b in bounds)
    if base.items is not None and literal:
        lower, upper, step = (None if b is None else b.value for b in bounds)  # type: ignore[attr-defined]
        if step != 0:
            kept = base.items[lower:upper:step]
            return Seq(kept, join(*kept), base.pipeline)
    return Seq(None, element_of(base), base.pipeline)


class ExprMixin:
    def module_frame(self: Analyzer, info: ModuleInfo) -> Frame:
        return Frame(None, info, self.config.display(info.file), {}, {}, False, 0)

    def origin(self: Analyzer, frame: Frame, kind: str, what: str, node: ast.AST) -> Ids:
        return Ids(frozenset({Origin(kind, what, frame.file, getattr(node, "lineno", 0))}))

    def unknown(self: Analyzer, frame: Frame, reason: str, node: ast.AST) -> Unknown:
        return Unknown(reason, frame.file, getattr(node, "lineno", 0))

    def eval(self: Analyzer, frame: Frame, node: ast.expr) -> Value:
        if frame.narrow and isinstance(node, ast.Name | ast.Attribute):
            narrowed = frame.narrow.get(expression_path(node) or "")
            if narrowed is not None:
                return narrowed
        if isinstance(node, ast.Name):
            return self.lookup_name(frame, node.id, node)
        if isinstance(node, ast.Attribute):
            return self.attribute(frame, self.eval(frame, node.value), node.attr, node)
        if isinstance(node, ast.Call):
            return self.eval_call(frame, node)
        if isinstance(node, ast.Subscript):
            return self.subscript(frame, self.eval(frame, node.value), node)
        if isinstance(node, ast.Constant | ast.JoinedStr):
            for part in ast.walk(node):
                if isinstance(part, ast.FormattedValue):
                    self.eval(frame, part.value)
            return OPAQUE
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            parts: list[Value] = []
            known = True
            for e in node.elts:
                if isinstance(e, ast.Starred):  # [*meta, x]: the items it spreads, where known
                    spread = self.as_iterated(self.eval(frame, e.value))
                    known = known and isinstance(spread, Seq) and spread.items is not None
                    parts += spread.items if isinstance(spread, Seq) and spread.items is not None else [element_of(spread)]
                else:
                    parts.append(self.eval(frame, e))
            return Seq(tuple(parts) if known else None, join(*parts))
        if isinstance(node, ast.Dict):
            values = [self.eval(frame, v) for v in node.values]
            for key in node.keys:
                if key is not None:
                    self.eval(frame, key)
            constant = all(isinstance(k, ast.Constant) for k in node.keys)
            items = tuple((k.value, v) for k, v in zip(node.keys, values, strict=True)) if constant else None  # type: ignore[union-attr]
            return MapV(join(*values), items)
        if isinstance(node, ast.BoolOp):
            return self.bool_op(frame, node)
        if isinstance(node, ast.BinOp):
            left, right = self.eval(frame, node.left), self.eval(frame, node.right)
            if isinstance(node.op, ast.Add):  # meta + (x,): a NamedTuple is the tuple of its fields
                left, right = self.as_iterated(left), self.as_iterated(right)
            if isinstance(node.op, ast.Add) and isinstance(left, Seq) and isinstance(right, Seq):
                both = None if left.items is None or right.items is None else left.items + right.items
                return Seq(both, join(left.elem, right.elem))  # [a, b] + [c]: a list of all three
            if isinstance(node.op, ast.Mult) and isinstance(left, Seq) != isinstance(right, Seq):
                return Seq(None, element_of(left if isinstance(left, Seq) else right))  # [layer] * n
            return join(taint(left), taint(right))
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(frame, node.operand)
            if isinstance(node.op, ast.Not):
                return negate(operand)
            return taint(operand)
        if is_none_compare(node):
            assert isinstance(node, ast.Compare)
            when_true, when_false = self.none_compare_facts(frame, node)
            if when_true.fresh or when_false.fresh:
                return Flag(when_true.fresh, when_false.fresh, when_true.device, when_false.device)
            return OPAQUE
        if isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                self.eval(frame, part)
            return OPAQUE
        if isinstance(node, ast.IfExp):
            when_true, when_false = self.guard(frame, node.test)
            sides = [(node.body, when_true), (node.orelse, when_false)]
            # where the step has no device ids, a side that needs them is never taken
            return join(*(self.eval_with(frame, side, facts) for side, facts in sides if not never_taken(frame.fresh, facts)))
        if isinstance(node, ast.NamedExpr):
            value = self.eval(frame, node.value)
            self.assign(frame, node.target, value)
            return value
        if isinstance(node, ast.Lambda):
            info = FuncInfo(frame.module.name, f"{frame.name}.<lambda>", node.lineno, frame.module.file, node)
            return Func(info, None, tuple(sorted({**frame.closure, **frame.env}.items(), key=lambda kv: kv[0])))
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            return Seq(None, self.comprehension(frame, node.generators, node.elt))
        if isinstance(node, ast.DictComp):
            return MapV(self.comprehension(frame, node.generators, node.value))
        if isinstance(node, ast.Starred | ast.Await):
            return self.eval(frame, node.value)
        if isinstance(node, Given):
            return node.value
        if isinstance(node, ast.Yield | ast.YieldFrom):
            value = OPAQUE if node.value is None else self.eval(frame, node.value)
            if frame.yield_writes is None:
                frame.yield_writes, frame.yield_value = dict(frame.writes), value
            return OPAQUE
        if isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.eval(frame, part)
            return OPAQUE
        return OPAQUE

    def bool_op(self: Analyzer, frame: Frame, node: ast.BoolOp) -> Value:
        """``a or b`` / ``a and b``: one of the operands, as Python returns it. Operand ``i`` runs
        only where the ones before it were all false (``or``) or all true (``and``), so it is
        evaluated under what those sides imply: ``inp.device_tokens or inp.host_tokens`` takes the
        host tokens only where there are no device ids. Made only of tests, the whole is a flag."""
        conj = isinstance(node.op, ast.And)
        values, fresh = [], False
        for operand in node.values:
            values.append(self.eval_with(frame, operand, Facts(fresh, {})))
            when_true, when_false = self.guard(frame, operand)
            fresh = fresh or (when_true.fresh if conj else when_false.fresh)
        if all(isinstance(v, Flag) or v == OPAQUE for v in values):
            flag = self.flag_of(frame, node)
            if flag is not None:
                return flag
        return join(*values)

    def eval_with(self: Analyzer, frame: Frame, node: ast.expr, facts: Facts) -> Value:
        saved = self.with_facts(frame, facts)
        try:
            return self.eval(frame, node)
        finally:
            frame.fresh, frame.narrow = saved

    def comprehension(self: Analyzer, frame: Frame, generators: list[ast.comprehension], elt: ast.expr) -> Value:
        """The element of a comprehension, evaluated where its filters hold: ``[... for r in rows
        if r not in stale]`` is a guard, as the same test in a conditional expression is."""
        saved, facts_before = dict(frame.env), (frame.fresh, frame.narrow)
        try:
            for gen in generators:
                self.assign(frame, gen.target, self.iterated(self.eval(frame, gen.iter)))
                for cond in gen.ifs:
                    self.eval(frame, cond)
                    self.with_facts(frame, self.guard(frame, cond)[0])
            return self.eval(frame, elt)
        finally:
            frame.env = saved
            frame.fresh, frame.narrow = facts_before

    def lookup_name(self: Analyzer, frame: Frame, name: str, node: ast.AST) -> Value:
        if frame.default_cells and name in frame.default_cells and frame.default_cells[name] in frame.published:
            return frame.published[frame.default_cells[name]]  # the shared default, as calls left it
        if name in frame.env:
            return frame.env[name]
        if name in frame.closure:
            cell = closure_cell(frame, name) if frame.published else None
            kept = frame.published.get(cell) if cell is not None else None
            return frame.closure[name] if kept is None else kept  # what a `nonlocal` write left there
        cell = module_cell(frame, name)
        if name in frame.module.global_cells and frame.func is not None:
            if cell in frame.published:
                return frame.published[cell]
            return self.unknown(frame, f"reads scope global {cell} where no enclosing scope publishes it", node)
        if name == "super" and frame.func is not None:
            return External("builtins.super")
        if cell in self.globals_written_through_modules and cell in frame.published:
            return frame.published[cell]  # written through the module object: sys.modules[__name__].K = v
        value = self.resolve_global(frame.module.name, name)
        if frame.fills:  # a module-level buffer or container this call filled in place
            kept = frame.filled(self.module_variable(frame.module.name, name) or _external_variable(value))
            if kept is not None:
                return kept
        return value

    def filled_variable(self: Analyzer, frame: Frame, expr: ast.expr) -> str | None:
        """The module-level variable (``module.NAME``, where it is assigned) that ``expr`` names
        when it is filled in place: a module-level name of ``frame``'s module (imported ones
        followed to their module) or ``module.NAME`` on an imported module; else None (a local, a
        closure's, an attribute of an object)."""
        if isinstance(expr, ast.Name):
            if expr.id in frame.env or expr.id in frame.closure:
                return None
            return self.module_variable(frame.module.name, expr.id) or _external_variable(
                self.resolve_global(frame.module.name, expr.id)
            )
        if isinstance(expr, ast.Attribute):
            base = self.eval(frame, expr.value)
            if isinstance(base, ModuleRef):
                return self.module_variable(base.name, expr.attr)
            if isinstance(base, External) and not base.instance:  # a module the checker does not read
                return f"{base.dotted}.{expr.attr}"
        return None

    def read_cell(self: Analyzer, frame: Frame, cell: str, node: ast.AST) -> Value:
        if cell in frame.published:
            return frame.published[cell]
        return self.unknown(frame, f"reads scope {cell} where no enclosing scope publishes it", node)

    def attribute(self: Analyzer, frame: Frame, base: Value, name: str, node: ast.AST) -> Value:
        if hasattr(base, "options"):
            return join(*(self.attribute(frame, o, name, node) for o in base.options))  # type: ignore[attr-defined]
        if isinstance(base, Input):
            if name in ("device_tokens", "host_tokens"):
                kind = name.partition("_")[0]
                return Tokens(kind, fresh=kind == "host" and frame.fresh)
            if name == "embedding_ids":
                return Bound(base, name)
            if name == "has_stale_rows":  # false: no row is spliced, host ids are fresh
                return STALE_ROWS
            return OPAQUE
        if isinstance(base, Tokens):
            if name == "ids":
                if base.kind == "device":
                    return self.origin(frame, "device", "inp.device_tokens.ids", node)
                return self.host_read(frame, host_kind(frame, base), "inp.host_tokens.ids", node)
            if name in STALE_TESTS and base.kind == "host":  # empty / false: every host id is fresh
                return STALE_ROWS
            if name == "stale" and base.kind == "host":  # the [num_tokens] mask: `.any()` is the same test
                return STALE_MASK
            if name in ("row_ids", "placeholder_buffer") or (name in STATE_DUMPS and base.kind == "host"):
                return Bound(base, name)
            if name == "_ids" and base.kind == "host":  # the private buffer: the raw read, bypassed
                return self.host_read(frame, "host_raw", "inp.host_tokens._ids", node)
            return OPAQUE
        if is_stale_test(base, name):
            return Bound(base, name)
        if isinstance(base, Ids | Bound | Opaque):
            # a tensor method or attribute: ids flow through it unless it is metadata
            return Bound(OPAQUE if name in METADATA_ATTRS else taint(base), name)
        if isinstance(base, MapV) and any(k == name for k, _ in base.items or ()):
            return base.lookup(name)  # nn.ModuleDict: a sub-module by attribute (nanoGPT's transformer.wte)
        if isinstance(base, Seq | MapV):
            return Bound(base, name)
        if isinstance(base, Instance):
            return self.instance_attribute(frame, self.current(frame, base), name, node)
        if isinstance(base, ClassRef):
            cell = self.class_cell_for(base.info, name)
            if cell is not None:
                return self.read_cell(frame, cell, node)
            kept = self.kept_on_the_class(frame, base.info, name)
            if kept is not None:
                return kept
            member = self.class_member(base.info, name)
            if member is None:
                return self.unknown(frame, f"{base.info.dotted} has no attribute {name!r}", node)
            value, _ = member
            if isinstance(value, Func) and "classmethod" in self.decorators(value):
                return Func(value.info, base)
            return value
        if isinstance(base, Super):
            return self.super_attribute(frame, base, name, node)
        if isinstance(base, ModuleRef):
            cell = f"{base.name}.{name}"  # state.K = v, or K = v under `global K` in that module
            if cell in frame.published and (
                cell in self.globals_written_through_modules
                or name in getattr(self.load_module(base.name), "global_cells", ())
            ):
                return frame.published[cell]
            kept = frame.filled(self.module_variable(base.name, name)) if frame.fills else None
            return kept if kept is not None else self.resolve_global(base.name, name)  # filled in place here
        if isinstance(base, External):
            kept = frame.filled(f"{base.dotted}.{name}") if frame.fills and not base.instance else None
            if kept is not None:  # a module the checker does not read: its buffer filled in place here
                return kept
            return Bound(base, name) if base.instance else External(f"{base.dotted}.{name}")
        if isinstance(base, Cell):
            if base.kind == "local":
                return self.read_cell(frame, f"{base.name}.{name}", node)
            return Bound(base, name)
        if isinstance(base, Func) and name == "__wrapped__":  # functools.wraps: the def's own body
            return Func(base.info, None, base.closure, raw=True)
        if isinstance(base, Func) and name == "__func__":
            return Func(base.info, None, base.closure, base.raw)
        if isinstance(base, Unknown):
            return base
        return OPAQUE

    def kept_on_the_class(self: Analyzer, frame: Frame, info: ClassInfo, name: str) -> Value | None:
        """What this call stored in class attribute ``name`` of ``info`` or a base, from outside
        the class (``Holder.ids = ...``, ``type(model).last_ids = ...``), if anything."""
        for klass in self.mro(info):
            if isinstance(klass, ClassInfo) and class_cell(klass, name) in frame.published:
                return frame.published[class_cell(klass, name)]
        return None

    def instance_attribute(self: Analyzer, frame: Frame, base: Instance, name: str, node: ast.AST) -> Value:
        own = frame.self_writes.get(name) if base == frame.self_value else None
        if own is None and base == frame.self_value:
            own = frame.lazy_fields.get(name)
        if own is not None:
            return own
        value = base.field(name)
        if value is not None:
            return value
        cell = self.class_cell_for(base.info, name)
        if cell is not None:
            return self.read_cell(frame, cell, node)
        kept = self.kept_on_the_class(frame, base.info, name)
        if kept is not None:
            return kept
        member = self.class_member(base.info, name)
        if member is None:
            return self.unknown(
                frame, f"{base.info.dotted}.{name} is neither set in __init__ nor defined on the class", node
            )
        if base == frame.self_value and (frame.self_writes or frame.lazy_fields):
            # self.run() after self.prepare(): the callee sees what this method assigned so far
            fields = dict(base.fields)
            fields.update(frame.lazy_fields)
            fields.update(frame.self_writes)
            base = Instance(base.info, tuple(sorted(fields.items(), key=lambda kv: kv[0])))
            frame.self_aliases.add(base)
        return self.bind_member(frame, member[0], base, node)

    def bind_member(self: Analyzer, frame: Frame, member: Value, receiver: Value, node: ast.AST) -> Value:
        if isinstance(member, External):
            owner, _, attr = member.dotted.rpartition(".")
            if attr in ("forward", "__call__") and self.canonical(owner) in self.sink_modules:
                # super().forward(ids) in an nn.Embedding subclass: the inherited lookup is the sink
                return External(owner, instance=True)
            kept = isinstance(receiver, Instance) and any(attr in names for names in (RETURNS_SELF, SUBMODULE_WALKS, SUBMODULE_PATHS, RECORD_METHODS))
            return Bound(receiver if kept else OPAQUE, attr)
        if isinstance(member, Instance) and receiver != OPAQUE:
            getter = self.class_member(member.info, "__get__")
            if getter is not None and isinstance(getter[0], Func):  # a descriptor: its __get__ gives the value
                owner = ClassRef(receiver.info) if isinstance(receiver, Instance) else OPAQUE
                return self.call(frame, self.bind_member(frame, getter[0], member, node), (receiver, owner), (), node)
        if not isinstance(member, Func) or member.bound is not None:
            return member
        decorators = self.decorators(member)
        if "staticmethod" in decorators:
            return member
        if "classmethod" in decorators:
            owner = receiver.info if isinstance(receiver, Instance) else None
            return dataclasses.replace(member, bound=ClassRef(owner) if isinstance(owner, ClassInfo) else receiver)
        bound = dataclasses.replace(member, bound=receiver)  # a closure made by a decorator keeps its cells
        if "property" in decorators:
            return self.call(frame, bound, (), (), node)
        if "cached_property" in decorators:  # computed once, then kept on the instance for later calls
            return stored_beyond_the_call(self.call(frame, bound, (), (), node))
        return bound

    def super_attribute(self: Analyzer, frame: Frame, base: Super, name: str, node: ast.AST) -> Value:
        receiver = base.receiver
        start = receiver.info if isinstance(receiver, Instance | ClassRef) else base.info
        member = self.class_member(start, name, after=base.info)
        if member is None:
            return self.unknown(frame, f"super() of {base.info.dotted} has no {name!r}", node)
        return self.bind_member(frame, member[0], receiver, node)

    def module_named(self: Analyzer, frame: Frame, key: ast.expr) -> str | None:
        """The module a ``sys.modules`` key names where it is fixed: ``__name__`` (this module) or
        a string constant; else None."""
        if isinstance(key, ast.Name) and key.id == "__name__" and "__name__" not in frame.env:
            return frame.module.name
        names = self.constant_names(frame, key)
        return names[0] if names is not None and len(names) == 1 else None

    def subscript(self: Analyzer, frame: Frame, base: Value, node: ast.Subscript) -> Value:
        index = self.eval(frame, node.slice)
        base = self.record_items(base) or base  # meta[1] of a NamedTuple: its second field
        if isinstance(base, Seq):
            if base.items is not None and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                position = node.slice.value
                if -len(base.items) <= position < len(base.items):
                    return base.items[position]
            if isinstance(node.slice, ast.Slice):
                return _sliced(base, node.slice)
            return element_of(base)
        if isinstance(base, MapV):
            key = node.slice
            return self.lookup(frame, base, key)
        if isinstance(base, Cell) and base.kind == "stack":
            return self.read_cell(frame, base.name, node)
        if base == SYS_MODULES and (module := self.module_named(frame, node.slice)) is not None:
            return self.module_value(module)  # sys.modules[__name__], sys.modules["pkg.state"]
        if isinstance(base, Instance):
            getter = self.class_member(base.info, "__getitem__")
            if getter is not None and isinstance(getter[0], Func):  # a registry: INTERFACE[name]
                return self.call(frame, self.bind_member(frame, getter[0], self.current(frame, base), node), (index,), (), node)
        if isinstance(base, Ids | Unknown):
            return join(base, taint(index))
        if isinstance(base, ClassRef | External) and not getattr(base, "instance", False):
            return base  # a generic alias (list[int], Float[Tensor, "n"]) in an annotation
        if self.config.index_is_sink and has_ids(index):
            self.sink(frame, "table[ids] gather", index, node)
            return OPAQUE
        return join(taint(base), taint(index))


SYS_MODULES = External("sys.modules")


def _external_variable(value: Value) -> str | None:
    """The dotted name of a module-level object of a module the checker does not read
    (``from buffers import INPUT_IDS``), which a forward may fill in place."""
    return value.dotted if isinstance(value, External) and not value.instance else None
