"""Views: expressions that name (part of) another tensor's memory, and the names that share it.

Writing into a view writes into the tensor it views: ``buf[:n] = ids``, ``buf.view(-1).copy_(ids)``,
``buf.numpy()[:n] = ids``. Engines keep such views beside their buffers — vLLM's ``CpuGpuBuffer``
holds ``.np = .cpu.numpy()`` and fills the numpy array — so a name bound to a view of another
(``self.ids_np = self.ids.numpy()``, ``IDS_NP = IDS.numpy()``) shares its memory: ids written
through one are read through the other.
"""

from __future__ import annotations

import ast

VIEWS = frozenset({
    "narrow", "view", "view_as", "reshape", "select", "flatten", "squeeze", "unsqueeze", "__getitem__",
    "numpy", "detach", "t", "transpose", "permute", "movedim", "unflatten", "expand", "as_strided",
    "ravel", "swapaxes",
})
"""Tensor methods whose result is a view of the tensor: writing into it writes into the tensor
(``numpy()``: the array shares the CPU tensor's memory)."""

ATTRIBUTE_VIEWS = frozenset({"T", "mT", "data", "flat"})
"""Attributes that are a view of the tensor or array they are read on (``buf.data[:n] = ids``)."""

SHARING_FUNCTIONS = frozenset({"from_numpy", "asarray", "as_tensor", "frombuffer"})
"""Functions whose result shares the memory of their first argument where it can (``torch.from_numpy``,
``np.asarray`` of a CPU tensor, ``torch.as_tensor`` of an array): the same memory, another type."""


def viewed(expr: ast.expr) -> ast.expr:
    """The expression whose memory ``expr`` views: ``expr`` with its subscripts, view methods and
    memory-sharing conversions taken off (``np.asarray(buf)[:n].view(-1)`` → ``buf``), and
    ``getattr(obj, "buf")`` read as ``obj.buf``."""
    while True:
        if isinstance(expr, ast.Subscript) and (name := global_item(expr)) is not None:
            return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), expr)  # globals()["K"] is K
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in VIEWS:
            expr = expr.func.value
        elif isinstance(expr, ast.Attribute) and expr.attr in ATTRIBUTE_VIEWS:
            expr = expr.value
        elif isinstance(expr, ast.Call) and _function_name(expr.func) in SHARING_FUNCTIONS and len(expr.args) == 1:
            expr = expr.args[0]
        elif (named := fetched_attribute(expr)) is not None:  # getattr(obj, "a") is obj.a
            return named
        else:
            return expr


def fetched_attribute(expr: ast.expr) -> ast.Attribute | None:
    """``obj.a`` for ``getattr(obj, "a")`` (with or without a default); else None."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "getattr" and len(expr.args) in (2, 3)):
        return None
    name = expr.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    return ast.copy_location(ast.Attribute(value=expr.args[0], attr=name.value, ctx=ast.Load()), expr)


def global_item(expr: ast.Subscript) -> str | None:
    """``K`` for ``globals()["K"]``; else None."""
    key = expr.slice
    return key.value if is_globals(expr.value) and isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def is_globals(expr: ast.expr) -> bool:
    """Whether ``expr`` is the call ``globals()``."""
    return (
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "globals"
        and not expr.args and not expr.keywords
    )


def _function_name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def shared_attributes(functions: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> dict[str, frozenset[str]]:
    """Attribute path -> every attribute path sharing its memory, from the ``self.a = self.b.numpy()``
    (or ``= self.b``, ``= self.b[:4]``, ``= self.buf.cpu.numpy()``...) assignments the methods
    ``functions`` make on their receiver; a path is the attribute chain after the receiver
    (``"buf.cpu"``). A path sharing nothing is absent."""
    pairs = []
    for func in functions:
        params = [*func.args.posonlyargs, *func.args.args]
        if not params:
            continue
        receiver = params[0].arg
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                source = _path(viewed(node.value), receiver)
                targets = [t for t in (_path(t, receiver) for t in node.targets) if t is not None]
                pairs += [(target, source) for target in targets if source is not None and target != source]
                pairs += [(targets[0], other) for other in targets[1:]]  # self.a = self.b = torch.zeros(n)
    return _groups(pairs)


def shared_globals(module: ast.Module) -> dict[str, frozenset[str]]:
    """Module-level name -> every module-level name sharing its memory (``IDS_NP = IDS.numpy()``,
    ``A = B = torch.zeros(n)``)."""
    pairs = []
    for stmt in module.body:
        if isinstance(stmt, ast.Assign):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
            source = viewed(stmt.value)
            pairs += [(name, source.id) for name in names if isinstance(source, ast.Name) and source.id != name]
            pairs += [(names[0], other) for other in names[1:]]  # A = B = torch.zeros(n): one tensor
    return _groups(pairs)


def _path(expr: ast.expr, receiver: str) -> str | None:
    """``self.buf.cpu`` -> ``"buf.cpu"`` (``receiver`` is ``self``); None for anything else."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return ".".join(reversed(parts)) if parts and isinstance(expr, ast.Name) and expr.id == receiver else None


def _groups(pairs: list[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """The connected groups of names ``pairs`` link, each name mapped to its group."""
    groups: dict[str, frozenset[str]] = {}
    for a, b in pairs:
        merged = groups.get(a, frozenset({a})) | groups.get(b, frozenset({b}))
        for name in merged:
            groups[name] = merged
    return groups
