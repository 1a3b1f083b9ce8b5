"""Name resolution from source: module globals, imports and re-exports, classes and their hierarchy.

Everything here reads the AST tables of :mod:`~tokenstate.checker.sources`; nothing is
imported. Results are cached per checker run.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import sys
from typing import TYPE_CHECKING

from tokenstate.checker.evaluate import Given, element_of
from tokenstate.checker.patches import Deleted, class_member_writes, names_class
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
            for owner, name, value in class_member_writes(stmt, info, self.loop_items_in(info)):
                if names_class(owner, cls):
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
                    for owner, name, value in class_member_writes(stmt, info, self.loop_items_in(info)):
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
