"""Name resolution from source: module globals, imports and re-exports, classes and their hierarchy.

Everything here reads the AST tables of :mod:`~tokenstate.checker.sources`; nothing is
imported. Results are cached per checker run.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import sys
from typing import TYPE_CHECKING, cast

from tokenstate.checker.evaluate import Given, element_of
from tokenstate.checker.sources import ModuleInfo, SourceError, top_level_statements
from tokenstate.checker.values import (
    Cell,
    ClassInfo,
    ClassRef,
    External,
    Func,
    FuncInfo,
    MapV,
    ModuleRef,
    Seq,
    Unknown,
    Value,
    join,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tokenstate.checker.engine import Analyzer

__all__ = ["Patch", "ResolverMixin", "decorator_names"]

Patch = tuple[ModuleInfo, int, ast.expr]
"""A top-level statement replacing a class member: the module running it, its line, the new value."""

_CELL_FACTORIES = {"contextvars.ContextVar": "cvar", "threading.local": "local", "_thread._local": "local"}


def decorator_names(node: ast.AST) -> set[str]:
    """Last name segment of each decorator (``functools.wraps(f)`` → ``wraps``)."""
    names = set()
    for dec in getattr(node, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


class ResolverMixin:
    def _resolver_init(self: Analyzer) -> None:
        self._globals: dict[tuple[str, str], Value | None] = {}
        self._mro: dict[ClassInfo, list[ClassInfo | External]] = {}
        self._class_cells: dict[ClassInfo, set[str]] = {}
        self._canonical: dict[str, str] = {}
        # module -> line of the top-level statement being evaluated there (see at_statement)
        self._as_of: dict[str, int] = {}

    # ---- modules and globals -------------------------------------------------------------------

    def module_value(self: Analyzer, name: str) -> Value:
        return ModuleRef(name) if self.config.is_analysed(name) else External(name)

    def load_module(self: Analyzer, name: str) -> ModuleInfo | Unknown:
        try:
            return self.sources.module(name)
        except SourceError as exc:
            return Unknown(f"source unavailable: {exc.message}", self.config.display(exc.file), 0)

    def resolve_global(self: Analyzer, module: str, name: str) -> Value:
        key = (module, name)
        if key in self._globals:
            cached = self._globals[key]
            return cached if cached is not None else Unknown(f"{module}.{name} is defined circularly", module, 0)
        self._globals[key] = None  # in progress
        value = self._resolve_global(module, name)
        self._globals[key] = value
        return value

    def _resolve_global(self: Analyzer, module: str, name: str) -> Value:
        info = self.load_module(module)
        if isinstance(info, Unknown):
            return info
        node = info.bindings.get(name)
        if node is None:
            if self.sources.is_module(f"{module}.{name}"):
                return self.module_value(f"{module}.{name}")
            for star in info.star_imports:
                if self._star_provides(star, name, set()):
                    return self.resolve_global(star, name)
            if hasattr(builtins, name):
                return External(f"builtins.{name}")
            return Unknown(f"name {name!r} is not defined in module {module}", self.config.display(info.file), 0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return Func(FuncInfo(module, name, node.lineno, info.file, node))
        if isinstance(node, ast.ClassDef):
            return ClassRef(ClassInfo(module, name, node.lineno, info.file, node))
        if isinstance(node, ast.alias):  # import a.b [as x]
            return self.module_value(node.name if node.asname else node.name.partition(".")[0])
        if isinstance(node, ast.ImportFrom):
            return self._resolve_import_from(info, node, name)
        assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        with self.at_statement(module, node.lineno):  # _original = Model.fwd, before Model.fwd = wrapping
            return self._assigned_global(info, node, name)

    @contextlib.contextmanager
    def at_statement(self: Analyzer, module: str, line: int) -> Iterator[None]:
        """Evaluate as module ``module`` runs its top-level statement at ``line``: the class members
        it patches from there on are not patched yet (see :meth:`member_patch`)."""
        saved = self._as_of.get(module)
        self._as_of[module] = line
        try:
            yield
        finally:
            if saved is None:
                del self._as_of[module]
            else:
                self._as_of[module] = saved

    def _assigned_global(self: Analyzer, info: ModuleInfo, node: ast.Assign | ast.AnnAssign, name: str) -> Value:
        assert node.value is not None
        unpacked = next((t for t in getattr(node, "targets", ()) if isinstance(t, ast.Tuple | ast.List)
                         and any(isinstance(e, ast.Name) and e.id == name for e in t.elts)), None)
        if unpacked is None:
            return self._module_assignment(info, name, node.value)
        # A, B = ...: the item at A's place where the value's items are known, else any item
        value = self.eval(self.module_frame(info), node.value)
        index = next(i for i, e in enumerate(unpacked.elts) if isinstance(e, ast.Name) and e.id == name)
        starred = any(isinstance(e, ast.Starred) for e in unpacked.elts)
        if isinstance(value, Seq) and value.items is not None and len(value.items) == len(unpacked.elts) and not starred:
            return value.items[index]
        return element_of(value)

    def module_variable(self: Analyzer, module: str, name: str, depth: int = 0) -> str | None:
        """``module.name`` where ``name``, read in ``module``, is a variable assigned at module level
        — followed through ``from x import name`` to the module that assigns it — else None."""
        info = self.load_module(module)
        node = None if isinstance(info, Unknown) or depth > 8 else info.bindings.get(name)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            return f"{module}.{name}"
        if isinstance(node, ast.ImportFrom):
            source = info.resolve_relative(node.module, node.level)  # type: ignore[union-attr]
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            if self.config.is_analysed(source) and not self.sources.is_module(f"{source}.{original}"):
                return self.module_variable(source, original, depth + 1)
        return None

    def _star_provides(self: Analyzer, module: str, name: str, seen: set[str]) -> bool:
        """Whether ``from module import *`` binds ``name``: the module binds it, or one of its own
        star imports does (transformers: ``transformers`` → ``.models`` → ``.llama`` →
        ``.modeling_llama``, each under ``if TYPE_CHECKING:``)."""
        if module in seen or not self.config.is_analysed(module):
            return False
        seen.add(module)
        info = self.load_module(module)
        if isinstance(info, Unknown):
            return False
        return name in info.bindings or any(self._star_provides(star, name, seen) for star in info.star_imports)

    def _resolve_import_from(self: Analyzer, info: ModuleInfo, node: ast.ImportFrom, name: str) -> Value:
        source = info.resolve_relative(node.module, node.level)
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        full = f"{source}.{original}"
        if not self.config.is_analysed(source):
            return External(full)
        if self.sources.is_module(full):
            return ModuleRef(full)
        return self.resolve_global(source, original)

    def _module_assignment(self: Analyzer, info: ModuleInfo, name: str, expr: ast.expr) -> Value:
        cell = f"{info.name}.{name}"
        if name in info.stacks:
            return Cell(cell, "stack")
        if isinstance(expr, ast.Call):
            factory = self.eval(self.module_frame(info), expr.func)
            if isinstance(factory, External) and factory.dotted in _CELL_FACTORIES:
                return Cell(cell, _CELL_FACTORIES[factory.dotted])
        value = self.eval(self.module_frame(info), expr)
        if name in info.filled and isinstance(value, MapV):
            # entries added at run time (a registry filled by decorators...) are not in the literal
            added = Unknown(f"{cell} is filled at run time ({name}[key] = ...)", self.config.display(info.file), 0)
            return MapV(join(value.values, added), None)
        return value

    def canonical(self: Analyzer, dotted: str) -> str:
        """Follow re-exports (``from .x import f`` in a package ``__init__``) to where ``dotted`` is defined.

        Only our own and analysed packages are read; ``torch.nn.Embedding`` stays as written.
        """
        if dotted in self._canonical:
            return self._canonical[dotted]
        self._canonical[dotted] = dotted
        module, _, attr = dotted.rpartition(".")
        top = dotted.partition(".")[0]
        result = dotted
        if module and (top == "tokenstate" or top in self.config.roots) and self.sources.is_module(module):
            try:
                info = self.sources.module(module)
            except SourceError:
                info = None
            node = None if info is None else info.bindings.get(attr)
            if isinstance(node, ast.ImportFrom) and info is not None:
                source = info.resolve_relative(node.module, node.level)
                original = next(a.name for a in node.names if (a.asname or a.name) == attr)
                result = self.canonical(f"{source}.{original}")
        self._canonical[dotted] = result
        return result

    # ---- classes -------------------------------------------------------------------------------

    def class_module(self: Analyzer, cls: ClassInfo) -> ModuleInfo:
        return self.sources.module(cls.module)  # already parsed: the class came from it

    def mro(self: Analyzer, cls: ClassInfo) -> list[ClassInfo | External]:
        """The class's method resolution order, by Python's C3 linearization (external bases are
        leaves: nothing of theirs is read). A hierarchy C3 cannot order is one Python itself refuses
        to create; the checker then falls back to depth-first order."""
        if cls in self._mro:
            return self._mro[cls]
        self._mro[cls] = [cls]  # a class that (through aliases) names itself as a base
        frame = self.module_frame(self.class_module(cls))
        bases: list[ClassInfo | External] = []
        for base_expr in cls.node.bases:
            base = self.eval(frame, base_expr)
            for option in getattr(base, "options", (base,)):
                if isinstance(option, ClassRef):
                    bases.append(option.info)
                elif isinstance(option, External):
                    bases.append(option)
        bases = [b for b in bases if b != External("builtins.object")]  # every MRO ends in object
        linear = [self.mro(b) if isinstance(b, ClassInfo) else _external_mro(b) for b in bases]
        order = _c3_merge([*linear, list(bases)])
        if order is None:
            order = []
            for parents in linear:
                order += [p for p in parents if p not in order]
        self._mro[cls] = [cls, *order]
        return self._mro[cls]

    def class_member(self: Analyzer, cls: ClassInfo, name: str, after: ClassInfo | None = None) -> tuple[Value, ClassInfo | None] | None:
        """``name`` as found on the class hierarchy (skipping up to ``after`` for ``super()``).

        Returns the raw member (a Func for a ``def``, the value of a class-level assignment, or an
        External for something inherited from an external base) and the class defining it.
        """
        chain = self.mro(cls)
        if after is not None and after in chain:
            chain = chain[chain.index(after) + 1 :]
        fallback: External | None = None  # nowhere defined: nn.Module.__getattr__ (buffers, ...)
        for klass in chain:
            if isinstance(klass, External):
                if _lacks_member(klass, name):
                    # nn.Module has no token_ids: C3 goes on to a mixin listed after it
                    fallback = fallback or External(f"{klass.dotted}.{name}")
                    continue
                return External(f"{klass.dotted}.{name}"), None
            patches = self.class_patches(klass)
            decorator = patches.get(name) or patches.get("*")
            if decorator is not None:
                reason = f"@{decorator} assigns {klass.dotted}.{name}, and the checker does not follow class decorators"
                return Unknown(reason, self.config.display(klass.file), klass.line), klass
            patch = self.member_patch(klass, name)
            if patch is not None and isinstance(patch[2], Deleted):  # `del Class.name`: the next class's
                continue
            if patch is not None:  # Class.name = value at module level: it replaced the body's
                info, line, value = patch
                with self.at_statement(info.name, line):  # Class.fwd = wrap(Class.fwd): the one before
                    return self.eval(self.module_frame(info), value), klass
            for stmt in klass.node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
                    qualname = f"{klass.qualname}.{name}"
                    return Func(FuncInfo(klass.module, qualname, stmt.lineno, klass.file, stmt, klass)), klass
            for stmt in reversed(klass.node.body):
                if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        frame = self.module_frame(self.class_module(klass))
                        if isinstance(stmt.value, ast.Call):
                            factory = self.eval(frame, stmt.value.func)
                            if isinstance(factory, External) and factory.dotted == "contextvars.ContextVar":
                                return Cell(f"{klass.dotted}.{name}", "cvar"), klass
                        return self.eval(frame, stmt.value), klass
        return (fallback, None) if fallback is not None else None

    def member_patch(self: Analyzer, cls: ClassInfo, name: str) -> Patch | None:
        """The top-level statement that last replaced ``cls.name`` by the time it is read: another
        module's (run on import, after the class's own module) else the class's own module's —
        leaving out those a module has not reached yet where one of its statements is being
        evaluated (``_original = Model.fwd`` before ``Model.fwd = wrapping``)."""
        own = self.patched_after_body(cls).get(name, [])
        # while its own module runs, no other module has patched it
        others = self.patched_by_other_modules(cls).get(name, []) if cls.module not in self._as_of else []
        if not own and not others:  # the common case, on every member lookup
            return None
        reached = [p for p in (*own, *others) if p[1] < self._as_of.get(p[0].name, sys.maxsize)]
        return reached[-1] if reached else None

    def patched_after_body(self: Analyzer, cls: ClassInfo) -> dict[str, list[Patch]]:
        """Members a top-level statement of the class's own module assigns after the class body
        (``Class.name = value``, ``setattr(Class, "name", value)``, either in a loop over items
        it can evaluate, or inside an ``if`` / ``try`` / ``with`` block), in the module's order: by
        the time anything is called the module has run them."""
        found = self._patched_after_body.get(cls)
        if found is not None:
            return found
        found = self._patched_after_body[cls] = {}
        if "." in cls.qualname:  # a nested class is not a module-level name
            return found
        info = self.class_module(cls)
        for stmt in top_level_statements(info.tree.body, at_import=True):  # in `if` / `try` / `with` blocks too
            if getattr(stmt, "lineno", 0) <= cls.line:
                continue
            for owner, name, value in _class_member_writes(stmt, info, self.loop_items_in(info)):
                if _names_class(owner, cls):
                    found.setdefault(name, []).append((info, stmt.lineno, value))
        return found

    def patched_by_other_modules(self: Analyzer, cls: ClassInfo) -> dict[str, list[Patch]]:
        """Members of ``cls`` that a top-level statement of another module replaces, where that
        module is one its package imports when it is imported (``patches.py`` doing
        ``modeling.Model.token_ids = fast_token_ids``, as liger-kernel and unsloth patch
        transformers), in import order: each with the patching module, where its value is evaluated."""
        top = cls.module.partition(".")[0]
        patches = self._package_patches.get(top)
        if patches is None:
            patches = self._package_patches[top] = {}  # filled below; a lookup from inside sees none yet
            for info in self.imported_with_the_package(top):
                frame = self.module_frame(info)
                for stmt in top_level_statements(info.tree.body, at_import=True):
                    for owner, name, value in _class_member_writes(stmt, info, self.loop_items_in(info)):
                        patched = self.eval(frame, owner)
                        if isinstance(patched, ClassRef) and patched.info.module != info.name:
                            patches.setdefault(patched.info, {}).setdefault(name, []).append((info, stmt.lineno, value))
        return patches.get(cls, {})

    def loop_items_in(self: Analyzer, info: ModuleInfo) -> Callable[[ast.expr], list[ast.expr] | None]:
        """How a top-level loop of module ``info`` over computed items (``MODELS + EXTRA``,
        ``(*BASE, Extra)``) is read: its items where evaluating the expression knows them."""
        def items(expr: ast.expr) -> list[ast.expr] | None:
            value = self.eval(self.module_frame(info), expr)
            return [Given(v) for v in value.items] if isinstance(value, Seq) and value.items is not None else None
        return items

    def imported_with_the_package(self: Analyzer, top: str) -> list[ModuleInfo]:
        """The modules of package ``top`` that importing it imports: its ``__init__`` and, from
        there, every module-level import inside the package (not under ``if TYPE_CHECKING:``),
        up to :data:`MAX_IMPORTED_MODULES` of them."""
        found: dict[str, ModuleInfo] = {}
        queue, tried = [top], set()
        while queue and len(found) < MAX_IMPORTED_MODULES:
            name = queue.pop(0)
            if name in tried:
                continue
            tried.add(name)
            info = self.load_module(name)
            if not isinstance(info, ModuleInfo):
                continue
            found[name] = info
            for stmt in top_level_statements(info.tree.body, at_import=True):
                if isinstance(stmt, ast.Import):
                    queue += [a.name for a in stmt.names if a.name.partition(".")[0] == top]
                elif isinstance(stmt, ast.ImportFrom):
                    source = info.resolve_relative(stmt.module, stmt.level)
                    if source.partition(".")[0] == top:  # `from pkg import patches` may name a module
                        queue += [source, *(f"{source}.{a.name}" for a in stmt.names if a.name != "*")]
        return list(found.values())

    def module_constant(self: Analyzer, module: str, name: str) -> str | None:
        """The string literal a module-level ``NAME = "..."`` binds, where that is the module's only
        binding of the name and no function rebinds it (``global NAME``); else ``None``."""
        info = self.sources.module(module)
        if name in info.global_cells:
            return None
        bindings = [
            stmt for stmt in info.tree.body
            if isinstance(stmt, ast.Assign | ast.AnnAssign)
            and any(isinstance(t, ast.Name) and t.id == name for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
        ]  # fmt: skip
        value = getattr(bindings[0], "value", None) if len(bindings) == 1 else None
        return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None

    def class_constant(self: Analyzer, cls: ClassInfo, name: str) -> str | None:
        """The string literal a class-level ``name = "..."`` binds, where that binding is what C3
        finds first (transformers' ``_input_embed_layer = "embed_tokens"``); else ``None``."""
        for klass in self.mro(cls):
            if isinstance(klass, External):
                if _lacks_member(klass, name):
                    continue
                return None
            for stmt in reversed(klass.node.body):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    value = getattr(stmt, "value", None)
                    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
            if any(isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name for stmt in klass.node.body):
                return None
        return None

    def class_cells(self: Analyzer, cls: ClassInfo) -> set[str]:
        """Class attributes some method assigns through ``cls.X`` / ``Class.X`` / ``type(self).X``."""
        if cls in self._class_cells:
            return self._class_cells[cls]
        cells: set[str] = set()
        for node in ast.walk(cls.node):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if not isinstance(target, ast.Attribute):
                    continue
                base = target.value
                if (
                    (isinstance(base, ast.Name) and base.id in ("cls", cls.node.name))
                    or (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "type")
                ):
                    cells.add(target.attr)
        self._class_cells[cls] = cells
        return cells

    def class_cell_for(self: Analyzer, cls: ClassInfo, name: str) -> str | None:
        for klass in self.mro(cls):
            if isinstance(klass, ClassInfo) and name in self.class_cells(klass):
                return f"{klass.dotted}.{name}"
        return None

    def sink_base(self: Analyzer, cls: ClassInfo) -> str | None:
        """The sink module class ``cls`` inherits its call from, if any (no own forward/__call__)."""
        for klass in self.mro(cls):
            if isinstance(klass, External):
                dotted = self.canonical(klass.dotted)
                return dotted if dotted in self.sink_modules else None
            if any(
                isinstance(s, ast.FunctionDef) and s.name in ("forward", "__call__") for s in klass.node.body
            ):
                return None
        return None


def _live_class(dotted: str) -> type | None:
    """The class ``dotted`` names, if its module is already imported (nothing is imported here)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        value: object = module
        for attr in parts[cut:]:
            value = getattr(value, attr, None)
        return value if isinstance(value, type) else None
    return None


def _lacks_member(klass: External, name: str) -> bool:
    """Whether the loaded external class ``klass`` itself defines no ``name`` (its own ``__dict__``;
    its bases follow it in the MRO). An external not loaded may define anything: never skipped."""
    live = _live_class(klass.dotted)
    return live is not None and name not in vars(live)


def _external_mro(base: External) -> list[ClassInfo | External]:
    """An external base's own MRO when its class is already loaded (``nn.Embedding`` → ``nn.Module``),
    so that C3 orders it against the other bases as Python does; else the base alone."""
    live = _live_class(base.dotted)
    if live is None:
        return [base]
    tail = [External(f"{c.__module__}.{c.__qualname__}") for c in live.__mro__[1:] if c is not object]
    return [base, *tail]


def _key(klass: ClassInfo | External) -> object:
    """Identity of a class in C3: the loaded class object for externals (one class, many names)."""
    if isinstance(klass, External):
        return _live_class(klass.dotted) or klass.dotted
    return klass


def _c3_merge(sequences: list[list[ClassInfo | External]]) -> list[ClassInfo | External] | None:
    """C3 merge: repeatedly take the first head that is in no other sequence's tail."""
    pending = [list(seq) for seq in sequences if seq]
    merged: list[ClassInfo | External] = []
    while pending:
        for seq in pending:
            head = _key(seq[0])
            if not any(head in [_key(c) for c in other[1:]] for other in pending):
                break
        else:
            return None  # inconsistent hierarchy (Python raises TypeError for it)
        merged.append(seq[0])
        pending = [[c for c in seq if _key(c) != head] for seq in pending]
        pending = [seq for seq in pending if seq]
    return merged


MAX_IMPORTED_MODULES = 64
"""How many modules of a class's package are read for patches of its members (the package's import
closure; a large library's own modules are not patched by its own import)."""


def _class_member_writes(
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
        return _class_member_writes(loop, info, loop_items, calling)  # [setattr(c, "f", g) for c in (A,)]
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
                writes += _class_member_writes(inner, info, loop_items, calling)
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
            return [
                write
                for inner in top_level_statements(function.body, at_import=True)
                for write in _class_member_writes(_Substitute(bound).visit(copy.deepcopy(inner)), info, loop_items, calling | {function.name})
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
    its body reads is bound to: a parameter the call's argument (or its default); a local it
    assigns an unknown value (a patch it makes through one is unresolved, not another global's)."""
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
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) else []
        for name in (n for target in targets for n in _names_bound(target)):
            if name not in declared and name not in bound:
                bound[name] = Given(Unknown(f"a local of {function.name}() that patches a class", info.file, node.lineno))
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


def _names_class(owner: ast.expr, cls: ClassInfo) -> bool:
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
