"""Patches a module makes to classes when it is imported: the top-level statements that replace a
class member (``Model.ids_for = fast_ids``, ``setattr``, ``del``), in every shape they are written —
loops over items the checker can evaluate, comprehensions, tuple assignments, calls of the module's
own functions — each as ``(owner, name, value)`` with the loop's names or the function's parameters
replaced by what they stand for. :class:`~tokenstate.checker.resolve.ResolverMixin` decides which
class each owner is and when each patch has run.
"""

from __future__ import annotations

import ast
import copy
from typing import TYPE_CHECKING, cast

from tokenstate.checker.evaluate import Given
from tokenstate.checker.sources import ModuleInfo, top_level_statements
from tokenstate.checker.values import ClassInfo, ClassRef, Seq, Unknown

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Deleted", "class_member_writes", "names_class"]


def class_member_writes(
    stmt: ast.stmt, info: ModuleInfo, loop_items: Callable[[ast.expr], list[ast.expr] | None] | None = None,
    calling: frozenset[str] = frozenset(),
) -> list[tuple[ast.expr, str, ast.expr]]:
    """``(owner, name, value)`` for ``owner.name = value`` and ``setattr(owner, "name", value)`` at
    the top level of module ``info``, and for each of them in a loop over literal items (``for cls in
    (A, B): cls.name = value``, or over a module-level ``MODELS = (A, B)``) — or over items
    ``loop_items`` works out (``MODELS + EXTRA``) — with the loop's names replaced by each item's parts;
    and those a call of one of the module's own functions makes (``apply_patches()``,
    ``patch(Model, fast_ids)``), its parameters replaced by the call's arguments (``calling``: the
    functions being followed, each followed once)."""
    if isinstance(stmt, ast.Expr | ast.Assign) and (loop := _comprehension_loop(stmt.value)) is not None:
        return class_member_writes(loop, info, loop_items, calling)  # [setattr(c, "f", g) for c in (A,)]
    items: ast.expr | list[ast.expr] | None = stmt.iter if isinstance(stmt, ast.For) else None
    if isinstance(items, ast.Name) and isinstance(bound := info.bindings.get(items.id), ast.Assign):
        items = bound.value
    items = _dict_items(items, info) if isinstance(items, ast.Dict | ast.Call) else items
    if isinstance(items, ast.Tuple | ast.List) and not any(isinstance(e, ast.Starred) for e in items.elts):
        items = items.elts
    elif isinstance(stmt, ast.For) and loop_items is not None and _writes_members(stmt):
        items = loop_items(stmt.iter)
    if isinstance(stmt, ast.For) and isinstance(items, list):
        writes = []
        for item in items:
            bound = _loop_bindings(stmt.target, item)
            if bound is None:
                return []  # a loop whose items do not match its target: nothing known to replace
            substituted = [_Substitute(bound).visit(copy.deepcopy(inner)) for inner in stmt.body]
            for inner in _statements_run(substituted, info):  # in an `if` of the body too
                writes += class_member_writes(inner, info, loop_items, calling)
        return writes
    if isinstance(stmt, ast.Assign):
        pairs = [pair for target in stmt.targets for pair in [(target, stmt.value), *_unpacked(target, stmt.value)]]
        return [(t.value, t.attr, v) for t, v in pairs if isinstance(t, ast.Attribute)]
    if isinstance(stmt, ast.Delete | ast.Expr) and (deleted := _deletions(stmt)):
        return deleted
    if isinstance(stmt, ast.Expr) and isinstance(call := stmt.value, ast.Call):
        args = call.args
        if (isinstance(call.func, ast.Name) and call.func.id == "setattr" and len(args) == 3
                and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)):
            return [(args[0], args[1].value, args[2])]
        called = _called_function(call, info, calling)
        if called is not None:
            function, bound = called
            substituted = [_Substitute(bound).visit(copy.deepcopy(inner)) for inner in function.body]
            return [
                write
                for inner in _statements_run(substituted, info)  # `if enable:` decided by the argument given
                for write in class_member_writes(inner, info, loop_items, calling | {function.name})
            ]
    return []


def _statements_run(body: list[ast.stmt], info: ModuleInfo) -> list[ast.stmt]:
    """The statements of a patching loop's body (its names replaced by one item) that may run, as
    :func:`~tokenstate.checker.sources.top_level_statements` gives them, leaving out the side of an
    ``if`` whose test is decided for that item (``if cls is ModelA:``, ``if isinstance(cls, type):``,
    ``if DEBUG:`` with ``DEBUG = False``)."""
    out: list[ast.stmt] = []
    for stmt in body:
        decided = _decided(stmt.test, info) if isinstance(stmt, ast.If) else None
        if decided is None:
            out += top_level_statements([stmt], at_import=True)
        else:
            out += _statements_run(stmt.body if decided else stmt.orelse, info)  # type: ignore[attr-defined]
    return out


def _decided(test: ast.expr, info: ModuleInfo) -> bool | None:
    """What ``test`` is at the top level of module ``info``, where the source alone tells: a
    constant, a module-level name bound once to one, ``not``, ``and`` / ``or``, ``is`` / ``is not``
    between two definitions, ``isinstance(x, type)`` of a definition or a constant; else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _decided(test.operand, info)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):  # `and`: false once a part is; `or`: true once a part is
        parts = [_decided(part, info) for part in test.values]
        settles = isinstance(test.op, ast.Or)
        return settles if settles in parts else (not settles if all(p is not None for p in parts) else None)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is | ast.IsNot):
        left, right = _definition(test.left, info), _definition(test.comparators[0], info)
        if left is None or right is None:
            return None
        return (left == right) is isinstance(test.ops[0], ast.Is)
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance" and len(test.args) == 2
            and isinstance(test.args[1], ast.Name) and test.args[1].id == "type" and "type" not in info.bindings):
        subject = _definition(test.args[0], info)
        return None if subject is None else subject[0] == "class"
    definition = _definition(test, info)
    return bool(definition[1]) if definition is not None and definition[0] == "constant" else None


def _definition(expr: ast.expr, info: ModuleInfo) -> tuple[str, object] | None:
    """What ``expr`` names, where its module's source fixes it: ``("class", dotted name)``,
    ``("function", dotted name)`` or ``("constant", value)``; else None."""
    if isinstance(expr, Given):
        value = expr.value
        return ("class", value.info.dotted) if isinstance(value, ClassRef) else None
    if isinstance(expr, ast.Constant):
        return ("constant", expr.value)
    if not isinstance(expr, ast.Name):
        return None
    bound = info.bindings.get(expr.id)
    if isinstance(bound, ast.ClassDef):
        return ("class", f"{info.name}.{expr.id}")
    if isinstance(bound, ast.FunctionDef | ast.AsyncFunctionDef):
        return ("function", f"{info.name}.{expr.id}")
    constant = bound.value if isinstance(bound, ast.Assign) and len(bound.targets) == 1 else None
    return ("constant", constant.value) if isinstance(constant, ast.Constant) and _bound_once(expr.id, info) else None


def _bound_once(name: str, info: ModuleInfo) -> bool:
    """Whether the module's top level assigns ``name`` in one statement only (a flag never changed)."""
    assigned = [
        stmt for stmt in top_level_statements(info.tree.body)
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign)
        and any(isinstance(t, ast.Name) and t.id == name for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
    ]
    return len(assigned) == 1 and not any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(info.tree))


class Deleted(ast.expr):
    """What a member is after ``del Model.ids_for`` (or ``delattr(Model, "ids_for")``) at the top
    level: gone from the class, so that lookup goes on to the next class of the MRO."""

    _fields = ()


def _deletions(stmt: ast.Delete | ast.Expr) -> list[tuple[ast.expr, str, ast.expr]]:
    """``(owner, name, Deleted())`` for ``del owner.name`` and ``delattr(owner, "name")``."""
    if isinstance(stmt, ast.Delete):
        return [(t.value, t.attr, Deleted()) for t in stmt.targets if isinstance(t, ast.Attribute)]
    call = stmt.value
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "delattr" and len(call.args) == 2
            and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str)):
        return [(call.args[0], call.args[1].value, Deleted())]
    return []


def _unpacked(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """``(target, value)`` for each part of a tuple assignment of a literal tuple
    (``_original, Model.ids_for = Model.ids_for, patched``)."""
    if not (isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) and len(target.elts) == len(value.elts)):
        return []
    return list(zip(target.elts, value.elts, strict=True))


def _comprehension_loop(value: ast.expr) -> ast.For | None:
    """The loop a top-level list or set comprehension runs for its effects (``[setattr(c, "f", g)
    for c in (A, B)]``), as a ``for`` statement (its conditions an ``if`` in the body); else None."""
    if not (isinstance(value, ast.ListComp | ast.SetComp) and len(value.generators) == 1) or value.generators[0].is_async:
        return None
    generator = value.generators[0]
    body: ast.stmt = ast.Expr(value=value.elt)
    for condition in reversed(generator.ifs):
        body = ast.If(test=condition, body=[body], orelse=[])
    return ast.copy_location(ast.For(target=generator.target, iter=generator.iter, body=[body], orelse=[]), value)


def _dict_items(items: ast.expr, info: ModuleInfo) -> ast.expr:
    """A loop over a dict literal — ``{A: f}`` (its keys), ``{A: f}.items()``, ``.keys()``,
    ``.values()``, or the same of a module-level ``PATCHES = {...}`` — as a list literal of what it
    gives; any other ``items`` as it is."""
    table, part = items, "keys"
    if isinstance(items, ast.Call) and isinstance(items.func, ast.Attribute) and not items.args and not items.keywords:
        table, part = items.func.value, items.func.attr
    if isinstance(table, ast.Name) and isinstance(bound := info.bindings.get(table.id), ast.Assign):
        table = bound.value
    if not isinstance(table, ast.Dict) or part not in ("items", "keys", "values") or any(k is None for k in table.keys):
        return items
    keys = cast("list[ast.expr]", table.keys)
    found = {"keys": keys, "values": table.values, "items": [ast.Tuple(elts=[k, v], ctx=ast.Load()) for k, v in zip(keys, table.values, strict=True)]}
    return ast.List(elts=found[part], ctx=ast.Load())


def _called_function(call: ast.Call, info: ModuleInfo, calling: frozenset[str]) -> tuple[ast.FunctionDef, dict[str, ast.expr]] | None:
    """The module's own function a top-level call runs (``apply_patches()``), with what each name
    its body reads is bound to: a parameter the call's argument (or its default); a local assigned
    once at the function's top (``cls = Model``) its value; any other local an unknown value (a
    patch it makes through one is unresolved, not another global's)."""
    if not isinstance(call.func, ast.Name) or call.func.id in calling or len(calling) >= _MAX_PATCH_CALLS:
        return None
    function = info.bindings.get(call.func.id)
    if not isinstance(function, ast.FunctionDef) or function.decorator_list:
        return None
    params = function.args
    positional = [*params.posonlyargs, *params.args]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords) or len(call.args) > len(positional):
        return None  # f(*items), f(**options): which argument is which is not known here
    bound: dict[str, ast.expr] = dict(zip([p.arg for p in positional][-len(params.defaults):], params.defaults, strict=True)) if params.defaults else {}
    bound |= {p.arg: d for p, d in zip(params.kwonlyargs, params.kw_defaults, strict=True) if d is not None}
    bound |= {p.arg: a for p, a in zip(positional, call.args, strict=False)}
    bound |= {k.arg: k.value for k in call.keywords if k.arg is not None}
    if any(p.arg not in bound for p in (*positional, *params.kwonlyargs)):
        return None  # the call would raise TypeError: it patches nothing
    declared = {n for node in ast.walk(function) if isinstance(node, ast.Global) for n in node.names}
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) else []
        for name in (n for target in targets for n in _names_bound(target)):
            assigned.setdefault(name, []).append(node)
    params_bound = dict(bound)
    for name, sites in assigned.items():
        if name in declared or name in bound:
            continue
        site = sites[0]
        if len(sites) == 1 and site in function.body and isinstance(site, ast.Assign) and isinstance(site.targets[0], ast.Name) and len(site.targets) == 1:
            bound[name] = _Substitute(params_bound).visit(copy.deepcopy(site.value))  # `cls = Model`: an alias, assigned once
        else:
            bound[name] = Given(Unknown(f"a local of {function.name}() that patches a class", info.file, site.lineno))  # type: ignore[attr-defined]
    return function, bound


def _names_bound(target: ast.expr) -> list[str]:
    """The names an assignment target binds (``a``, ``a, (b, *c)``; not ``obj.a`` nor ``d[k]``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names_bound(target.value)
    return [n for elt in target.elts for n in _names_bound(elt)] if isinstance(target, ast.Tuple | ast.List) else []


_MAX_PATCH_CALLS = 4
"""How deep calls of a module's own functions at import are followed for the patches they make."""


def names_class(owner: ast.expr, cls: ClassInfo) -> bool:
    """Whether ``owner``, at the top level of the class's own module, is the class: its name, or an
    item a loop evaluated."""
    if isinstance(owner, Given):
        return isinstance(owner.value, ClassRef) and owner.value.info == cls
    return isinstance(owner, ast.Name) and owner.id == cls.qualname


def _writes_members(loop: ast.For) -> bool:
    """Whether a loop's body assigns an attribute of one of its names (worth evaluating its items)."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    return any(
        (isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in names for t in node.targets))
        or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr")
        for node in (n for stmt in loop.body for n in ast.walk(stmt))
    )


def _loop_bindings(target: ast.expr, item: ast.expr) -> dict[str, ast.expr] | None:
    """The names a ``for`` target binds to the parts of one literal item (``for cls, fn in ((A, f),)``)."""
    if isinstance(target, ast.Name):
        return {target.id: item}
    if isinstance(target, ast.Tuple | ast.List) and isinstance(item, Given) and isinstance(item.value, Seq) and item.value.items is not None:
        item = ast.Tuple(elts=[Given(v) for v in item.value.items], ctx=ast.Load())  # a pair the loop evaluated
    if isinstance(target, ast.Tuple | ast.List) and isinstance(item, ast.Tuple | ast.List) and len(target.elts) == len(item.elts):
        bound: dict[str, ast.expr] = {}
        for part, value in zip(target.elts, item.elts, strict=True):
            inner = _loop_bindings(part, value)
            if inner is None:
                return None
            bound.update(inner)
        return bound
    return None


class _Substitute(ast.NodeTransformer):
    """Replaces each read of a loop's names by the expression the iteration binds to it."""

    def __init__(self, bound: dict[str, ast.expr]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return copy.deepcopy(self.bound[node.id]) if isinstance(node.ctx, ast.Load) and node.id in self.bound else node
