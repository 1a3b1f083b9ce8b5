"""Finding and parsing source without importing it.

Modules are located with the import system's *finders* only (``find_spec`` of each meta-path
finder, parent package first) — finders read directories, they never execute a module — and parsed
once per file, cached by path and modification time. A module's top-level bindings (functions,
classes, imports, assignments, and the names its functions declare ``global``) are tabulated once.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenstate.checker.views import global_item

__all__ = ["ModuleInfo", "SourceError", "SourceTable"]


class SourceError(Exception):
    """A module's source is missing or cannot be parsed (internal; becomes a finding)."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
        self.message = message


# path -> (mtime_ns, size, tree | error); shared by every checker run in the process.
_PARSED: dict[str, tuple[int, int, ast.Module | SourceError]] = {}


def parse_file(path: str) -> ast.Module:
    """The AST of ``path`` (cached by path + mtime); raises :class:`SourceError`."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise SourceError(path, f"source file is missing ({exc.strerror})") from None
    cached = _PARSED.get(path)
    if cached is not None and cached[0] == stat.st_mtime_ns and cached[1] == stat.st_size:
        result = cached[2]
    else:
        try:
            with open(path, "rb") as handle:
                result = ast.parse(handle.read(), filename=path)
        except SyntaxError as exc:
            result = SourceError(path, f"cannot parse line {exc.lineno}: {exc.msg}")
        except (OSError, ValueError) as exc:
            result = SourceError(path, f"cannot read the source ({exc})")
        _PARSED[path] = (stat.st_mtime_ns, stat.st_size, result)
    if isinstance(result, SourceError):
        raise result
    return result


@dataclass
class ModuleInfo:
    """One parsed module and its top-level bindings."""

    name: str
    file: str
    is_package: bool
    tree: ast.Module
    # name -> the statement (or alias) that binds it, last binding wins
    bindings: dict[str, ast.AST] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)
    # names some function assigns after declaring them ``global``: scope stores
    global_cells: set[str] = field(default_factory=set)
    # module-level empty lists that some function appends to: scope stacks
    stacks: set[str] = field(default_factory=set)
    # module-level names that code assigns into (``TABLE[k] = f``, ``TABLE.update(...)``): their
    # contents are only known at run time
    filled: set[str] = field(default_factory=set)

    def resolve_relative(self, module: str | None, level: int) -> str:
        """The absolute module name of ``from <level dots><module> import ...`` inside this module."""
        if level == 0:
            return module or ""
        parts = self.name.split(".")
        base = parts if self.is_package else parts[:-1]
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, module] if module else base)


def top_level_statements(body: Sequence[ast.stmt], *, at_import: bool = False) -> list[ast.stmt]:
    """Statements of a module body, looking into if/try/with blocks (imports often hide there).
    ``at_import``: only what importing the module runs — not the ``if TYPE_CHECKING:`` blocks (whose
    names still bind for annotations otherwise) nor ``if __name__ == "__main__":``, and the
    ``finally`` blocks too."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = stmt.test
            checking = (test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)) == "TYPE_CHECKING"
            blocks = [stmt.orelse] if at_import and (checking or _runs_as_script(test)) else [stmt.body, stmt.orelse]
        elif isinstance(stmt, ast.Try):
            blocks = [stmt.body, stmt.orelse, *([stmt.finalbody] if at_import else [])]
        elif isinstance(stmt, ast.With):
            blocks = [stmt.body]
        else:
            out.append(stmt)
            continue
        for block in blocks:
            out += top_level_statements(block, at_import=at_import)
    return out


def _runs_as_script(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round): false when imported."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {test.left, test.comparators[0]}
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in sides) and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in sides)


def _tabulate(info: ModuleInfo) -> None:
    for stmt in top_level_statements(info.tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            info.bindings[stmt.name] = stmt
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                info.bindings[alias.asname or alias.name.partition(".")[0]] = alias
        elif isinstance(stmt, ast.ImportFrom):
            source = info.resolve_relative(stmt.module, stmt.level)
            for alias in stmt.names:
                if alias.name == "*":
                    info.star_imports.append(source)
                else:
                    info.bindings[alias.asname or alias.name] = stmt
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, ast.Name) and stmt.value is not None:
                    info.bindings[target.id] = stmt
                elif isinstance(target, ast.Tuple | ast.List):  # A, B = ... binds each name
                    info.bindings.update((e.id, stmt) for e in target.elts if isinstance(e, ast.Name))
    empty_lists = {
        name for name, stmt in info.bindings.items()
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(stmt.value, ast.List)
        and not stmt.value.elts
    }
    top_level = {id(stmt) for stmt in top_level_statements(info.tree.body)}
    for node in ast.walk(info.tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    info.filled.add(target.value.id)
            if id(node) not in top_level:  # in a function (or a class body): globals()["K"] = ...
                info.global_cells.update(global_names_spelt(node))
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("update", "setdefault") and isinstance(node.func.value, ast.Name)
        ):
            info.filled.add(node.func.value.id)
        if isinstance(node, ast.Global):
            info.global_cells.update(node.names)
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "insert") and isinstance(node.func.value, ast.Name)
            and node.func.value.id in empty_lists
        ):
            info.stacks.add(node.func.value.id)


class SourceTable:
    """Locates and parses modules for one checker run (parsed trees are shared process-wide)."""

    def __init__(self, search_paths: Sequence[Path] = ()) -> None:
        self._search_paths = [str(p) for p in search_paths]
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}
        self._modules: dict[str, ModuleInfo | SourceError] = {}

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """The module's spec, from the finders only (never imports ``name`` or its parents)."""
        if name in self._specs:
            return self._specs[name]
        spec = None
        parent, _, _ = name.rpartition(".")
        path: list[str] | None = None
        if parent:
            parent_spec = self.find_spec(parent)
            locations = None if parent_spec is None else parent_spec.submodule_search_locations
            path = None if locations is None else list(locations)
        if not parent or path is not None:
            if not parent and self._search_paths:
                spec = importlib.machinery.PathFinder.find_spec(name, self._search_paths)
            loaded = sys.modules.get(name)
            if spec is None and loaded is not None:
                spec = getattr(loaded, "__spec__", None)
            for finder in [] if spec is not None else sys.meta_path:
                find = getattr(finder, "find_spec", None)
                try:
                    spec = None if find is None else find(name, path)
                except (ImportError, ValueError, AttributeError):
                    spec = None
                if spec is not None:
                    break
        self._specs[name] = spec
        return spec

    def is_module(self, name: str) -> bool:
        return self.find_spec(name) is not None

    def module(self, name: str) -> ModuleInfo:
        """The parsed module ``name``; raises :class:`SourceError` naming what is missing."""
        cached = self._modules.get(name)
        if cached is None:
            cached = self._load(name)
            self._modules[name] = cached
        if isinstance(cached, SourceError):
            raise cached
        return cached

    def _load(self, name: str) -> ModuleInfo | SourceError:
        spec = self.find_spec(name)
        if spec is None:
            return SourceError(name, f"module {name!r} cannot be found (is it installed / on the path?)")
        is_package = spec.submodule_search_locations is not None
        origin = spec.origin
        if origin is None or origin == "namespace" or not origin.endswith(".py"):
            if is_package and origin in (None, "namespace"):
                return ModuleInfo(name, str(list(spec.submodule_search_locations or [])), True, ast.Module([], []))
            return SourceError(str(origin or name), f"module {name!r} has no Python source to read")
        try:
            tree = parse_file(origin)
        except SourceError as exc:
            return exc
        info = ModuleInfo(name, origin, is_package, tree)
        _tabulate(info)
        return info


def global_names_spelt(node: ast.AST) -> list[str]:
    """The module globals an assignment ``globals()["NAME"] = ...`` writes (a fixed string key). Made
    in a function, each is a scope cell, as a name declared ``global`` there is; at module level it
    is a plain binding."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
    return [name for t in targets if isinstance(t, ast.Subscript) and (name := global_item(t)) is not None]
