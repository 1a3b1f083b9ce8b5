"""Calls out of the analysed code: external functions and classes, sinks among them, and the
wrappers (``torch.compile``, checkpointing, ``importlib.import_module``) the checker cannot see into.

External code is a tensor operation: its result carries its arguments' token ids. The exceptions are
modelled here: embeddings (the sink set), containers of modules, ``functools.partial``, builtins
that iterate or copy, ``typing.cast``, ``importlib.import_module`` with a constant name, and any
analysed function or module *handed* to external code, which becomes ``unknown``.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tokenstate.checker.calls import FORWARD_HOOKS, is_code, kwarg_value
from tokenstate.checker.evaluate import element_of, host_kind
from tokenstate.checker.frame import Frame
from tokenstate.checker.values import (
    OPAQUE,
    ClassInfo,
    ClassRef,
    External,
    Func,
    Instance,
    MapV,
    Partial,
    Seq,
    Tokens,
    Value,
    carries_tokens,
    join,
    taint,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = ["HIDDEN", "ExternalMixin"]

_PLAIN_BUILTINS = frozenset(
    "len isinstance issubclass hasattr id print str repr bool int float callable hash format "
    "setattr delattr vars dir any all".split()
)
_SEQ_BUILTINS = frozenset("list tuple reversed sorted iter set frozenset filter".split())
_COPIES = frozenset({"copy.deepcopy", "copy.copy"})
HIDDEN = "runs it out of the checker's sight"


def _attributes_assigned_on(func: ast.AST, name: str) -> set[str]:
    """Attribute names ``func``'s body assigns on the object its parameter ``name`` holds."""
    out: set[str] = set()
    for node in ast.walk(func):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == name}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) >= 2:
            subject, attr = node.args[0], node.args[1]
            if isinstance(subject, ast.Name) and subject.id == name:
                out.add(attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else "*")
    return out


class ExternalMixin:
    def opaque_wrapper(self: Analyzer, func: Func) -> str | None:
        """The decorator (``torch.compile``, ``torch.jit.script``...) that hides ``func``'s body, if any.

        Other decorators are assumed to return the function they wrap (``functools.wraps`` style).
        """
        node = func.info.node
        if isinstance(node, ast.Lambda) or not node.decorator_list:
            return None
        if node in self._wrappers:
            return self._wrappers[node]
        found = None
        frame = self.module_frame(self.sources.module(func.info.module))
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            value = self.eval(frame, target)
            if isinstance(value, External) and self.canonical(value.dotted) in self.config.opaque_wrappers:
                found = value.dotted
                break
        self._wrappers[node] = found
        return found

    def analysed_decorators(self: Analyzer, node: ast.AST, module: str) -> tuple[tuple[str, Value], ...]:
        """The decorators of ``node`` (a ``def`` or ``class``) that are analysed code, innermost
        first, each with its source text: a factory call (``@trace(level=2)``) is evaluated to the
        decorator it returns. External decorators are left out (assumed to return what they wrap,
        except the opaque wrappers), and so are decorators the analysis cannot resolve."""
        if isinstance(node, ast.Lambda) or not getattr(node, "decorator_list", None):
            return ()
        found = self._decorators.get(node)
        if found is None:
            frame = self.module_frame(self.sources.module(module))
            found = tuple(
                (ast.unparse(decorator), value)
                for decorator in reversed(node.decorator_list)  # type: ignore[attr-defined]
                if is_code(value := self.eval(frame, decorator)) and not isinstance(value, ClassRef)
            )
            self._decorators[node] = found
        return found

    def decorated(self: Analyzer, frame: Frame, func: Func, node: ast.AST) -> Value:
        """``func`` as its analysed decorators leave it: each is called, innermost first, with what
        the one below returned, starting from the raw ``def`` (a logging wrapper, a registry that
        returns the function, a decorator that swaps in another function). A method binds what
        they return, as Python's descriptor does for a function."""
        decorators = () if func.raw else self.analysed_decorators(func.info.node, func.info.module)
        if not decorators:
            return func
        value: Value = Func(func.info, None, func.closure, raw=True)
        for _, decorator in decorators:
            value = self.call(frame, decorator, (value,), (), node)
        if func.bound is not None and isinstance(value, Func) and value.bound is None:
            return Func(value.info, func.bound, value.closure, value.raw)
        return value

    def class_patches(self: Analyzer, cls: ClassInfo) -> dict[str, str]:
        """Members an analysed class decorator assigns on the class it is given (``cls.forward =
        ...``, ``setattr(cls, name, ...)``; ``"*"`` for a computed name), each with the decorator's
        source: the checker does not follow what they assign, so those members are unknown."""
        found = self._class_patches.get(cls)
        if found is None:
            found = {}
            for text, decorator in self.analysed_decorators(cls.node, cls.module):
                target = decorator.info.node if isinstance(decorator, Func) else None
                params = [*target.args.posonlyargs, *target.args.args] if target is not None else []
                if not params:
                    continue
                for name in _attributes_assigned_on(target, params[0].arg):  # type: ignore[arg-type]
                    found.setdefault(name, text)
            self._class_patches[cls] = found
        return found

    def import_module(self: Analyzer, frame: Frame, dotted: str, node: ast.Call) -> Value:
        """``importlib.import_module("pkg.mod")`` is the module; a computed name is unknown."""
        name = node.args[0] if node.args else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return self.unknown(frame, f"{dotted.rpartition('.')[2]}() with a module name computed at run time", node)
        target = name.value
        if target.startswith("."):
            package = next((k.value for k in node.keywords if k.arg == "package"), None)
            base = package.value if isinstance(package, ast.Constant) and isinstance(package.value, str) else None
            if base is None:
                return self.unknown(frame, f"relative import_module({target!r}) without a constant package", node)
            level = len(target) - len(target.lstrip("."))
            parts = base.split(".")[: len(base.split(".")) - (level - 1)]
            target = ".".join([*parts, target.lstrip(".")]) if target.lstrip(".") else ".".join(parts)
        if dotted == "builtins.__import__":
            target = target.partition(".")[0]
        if self.config.is_analysed(target) and not self.sources.is_module(target):
            return self.unknown(frame, f"import_module({target!r}): no such module on the search path", node)
        return self.module_value(target)

    def call_external(self: Analyzer, frame: Frame, func: External, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Value:
        dotted = self.canonical(func.dotted)
        table = self.sink_modules if func.instance else self.sink_functions
        spec = table.get(dotted)
        if spec is not None:
            ids = args[spec.ids_index] if len(args) > spec.ids_index else kwarg_value(kwargs, spec.ids_keywords)
            self.sink(frame, f"{dotted}(ids)", ids or OPAQUE, node)
            return OPAQUE
        if dotted == "contextlib.suppress":  # a manager that swallows exceptions (see may_swallow)
            return External(dotted, instance=True)
        derived = join(*(taint(v) for v in (*args, *(v for _, v in kwargs))))
        if func.instance:
            return derived
        name = dotted.rpartition(".")[2]
        first = args[0] if args else OPAQUE
        if dotted == "functools.partial" and args:
            return Partial(args[0], args[1:], kwargs)
        if dotted.startswith("builtins."):
            if name in _PLAIN_BUILTINS:
                return OPAQUE
            if name == "type":
                return ClassRef(first.info) if isinstance(first, Instance) else OPAQUE
            if name == "range":
                return Seq(None, OPAQUE)
            if name == "enumerate":
                return Seq(None, Seq((OPAQUE, element_of(first)), element_of(first)))
            if name == "zip":
                parts = tuple(element_of(a) for a in args)
                return Seq(None, Seq(parts, join(*parts)))
            if name in _SEQ_BUILTINS:
                return Seq(None, element_of(first)) if args else Seq((), OPAQUE)
            if name == "next":
                return element_of(first)
            if name == "map" and args:
                results = self.call(frame, first, tuple(element_of(a) for a in args[1:]), (), node)
                return Seq(None, results)
            if name == "dict":
                # dict(wte=...) keeps its constant keys (nanoGPT's ModuleDict(dict(wte=..., h=...)))
                known = first.items if isinstance(first, MapV) else (None if args else ())
                items = None if known is None else (*known, *kwargs)
                return MapV(join(first.values if isinstance(first, MapV) else OPAQUE, *(v for _, v in kwargs)), items)
        if name in ("ModuleList", "ParameterList"):
            return Seq(first.items, first.elem) if isinstance(first, Seq) else Seq((), OPAQUE)
        if name == "Sequential":
            return Seq(args, join(*args), pipeline=True)
        if name in ("ModuleDict", "ParameterDict", "OrderedDict"):
            return MapV(first.values, first.items) if isinstance(first, MapV) else MapV(OPAQUE)
        if dotted in _COPIES and args:
            return first
        if dotted == "typing.cast" and len(args) == 2:
            return args[1]
        code = [v for v in (*args, *(v for _, v in kwargs)) if is_code(v)]
        if code:
            # torch.compile(model), checkpoint(layer, ids), vmap(f)...: the callee runs our code
            # where the analysis cannot follow it; its result and any ids handed over are unknown
            hidden = self.unknown(
                frame, f"analysed code is handed to {dotted}, which {HIDDEN} "
                "(torch.compile, checkpoint and other wrappers)", node,
            )
            if name in FORWARD_HOOKS:  # torch.nn.modules.module.register_module_forward_pre_hook(f)
                self.forward_hook(frame, name, node)
            elif any(carries_tokens(v) for v in (*args, *(v for _, v in kwargs))) or frame.published:
                self.unresolved(frame, hidden, node)
            return hidden
        if dotted.endswith("DeviceTokens.from_host"):
            if isinstance(first, Tokens) and first.kind == "host":  # the upload reads host.ids, which raises on a stale step
                self.host_read(frame, host_kind(frame, first), "DeviceTokens.from_host(inp.host_tokens)", node)
                return first  # an upload of host ids: only as fresh as the host ids themselves
            return Tokens("host")
        self.input_handed_out(frame, dotted, args, kwargs, node, modeled=dotted)  # its route: unknown
        if name[:1].isupper():
            return External(dotted, instance=True)
        return derived
