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

from tokenstate.checker.calls import FORWARD_HOOKS, code_reaches_tokens, is_code, kwarg_value
from tokenstate.checker.evaluate import STALE_MASK, element_of, host_kind
from tokenstate.checker.frame import Frame
from tokenstate.checker.guards import STALE_ROWS
from tokenstate.checker.thread_jobs import thread_job_call
from tokenstate.checker.values import (
    OPAQUE,
    ClassInfo,
    ClassRef,
    External,
    Func,
    FuncInfo,
    GenCM,
    Ids,
    Input,
    Instance,
    MapV,
    Partial,
    Pending,
    Seq,
    Tokens,
    Unknown,
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
_ITERATING_BUILTINS = _SEQ_BUILTINS | {"enumerate", "next"}
"""Builtins that iterate over their first argument (a ``typing.NamedTuple`` gives its fields)."""
_COPIES = frozenset({"copy.deepcopy", "copy.copy"})
_TEXT_RUNNERS = frozenset({"builtins.eval", "builtins.exec"})
_KERNEL_NAMESPACES = frozenset({"aten", "prims", "quantized", "mkldnn", "mkl", "onednn", "quantized_decomposed", "profiler"})
"""``torch.ops`` namespaces of torch's own kernels: no Python of the model's runs inside them."""
_REPLACES = frozenset({"dataclasses.replace", "copy.replace"})
_TOKEN_FIELDS = frozenset({"host_tokens", "device_tokens"})
"""Fields of the forward input that carry the step's tokens: replaced, the input is another one."""
HIDDEN = "runs it out of the checker's sight"
ALTERNATE_CONSTRUCTORS = frozenset({"from_pretrained", "from_config"})
"""Class methods of external classes that return an instance of the class."""


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

    def analysed_decorators(self: Analyzer, node: ast.AST, module: str, owner: ClassInfo | None = None,
                            frame: Frame | None = None) -> tuple[tuple[str, Value], ...]:
        """The decorators of ``node`` (a ``def`` or ``class``) that are analysed code, innermost
        first, each with its source text, evaluated where the def stands: in ``frame`` for a def
        inside a function, else in its module (with its class body's functions, for a method). A
        factory call (``@trace(level=2)``) is evaluated to the decorator it returns; a class is a
        decorator too (``@Traced``). External decorators are left out (assumed to return what they
        wrap, except the opaque wrappers), and so are decorators the analysis cannot resolve."""
        if isinstance(node, ast.Lambda) or not getattr(node, "decorator_list", None):
            return ()
        cached = frame is None
        if cached and node in self._decorators:
            return self._decorators[node]
        if frame is None:
            frame = self.module_frame(self.sources.module(module))
            if owner is not None:
                frame.env.update(self.class_body_functions(owner))
        found = tuple(
            (ast.unparse(decorator), value)
            for decorator in reversed(node.decorator_list)  # type: ignore[attr-defined]
            if is_code(value := self.eval(frame, decorator))
        )
        if cached:
            self._decorators[node] = found
        return found

    def class_body_functions(self: Analyzer, cls: ClassInfo) -> dict[str, Value]:
        """The functions a class body defines, as its own decorators see them (plain functions)."""
        return {
            stmt.name: Func(FuncInfo(cls.module, f"{cls.qualname}.{stmt.name}", stmt.lineno, cls.file, stmt, cls))
            for stmt in cls.node.body if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
        }

    def decorated(self: Analyzer, frame: Frame, func: Func, node: ast.AST) -> Value:
        """``func`` as its analysed decorators leave it (see :meth:`apply_decorators`); a method
        binds what they return, as Python's descriptor does for a function. A def inside a
        function had its decorators applied where it stands (its value is raw from then on)."""
        if func.raw:
            return func
        decorators = self.analysed_decorators(func.info.node, func.info.module, func.info.owner)
        if not decorators:
            return func
        value = self.apply_decorators(frame, Func(func.info, None, func.closure, raw=True), decorators, node)
        if func.bound is not None and isinstance(value, Func) and value.bound is None:
            return Func(value.info, func.bound, value.closure, value.raw)
        return value

    def apply_decorators(self: Analyzer, frame: Frame, raw: Func, decorators: tuple[tuple[str, Value], ...],
                         node: ast.AST) -> Value:
        """Call each decorator, innermost first, with what the one below returned, starting from
        the raw ``def`` — a logging wrapper, a registry that returns the function, a decorator that
        swaps in another function. A ``@contextmanager`` manager used as a decorator runs the
        function inside it (the function itself is what runs); a decorator that returns something
        the checker cannot call, or that applies itself again while it is applied, is unknown."""
        if raw.info.node in self._decorating:
            return self.unknown(frame, f"the decorators of {raw.info.dotted} apply themselves again (recursive decorators)", node)
        self._decorating.add(raw.info.node)
        try:
            value: Value = raw
            for text, decorator in decorators:
                if isinstance(decorator, GenCM):
                    continue
                result = self.call(frame, decorator, (value,), (), node)
                if not (is_code(result) or isinstance(result, Unknown)):
                    result = self.unknown(frame, f"@{text} returns something the checker cannot follow as a function", node)
                value = result
            return value
        finally:
            self._decorating.discard(raw.info.node)

    def class_patches(self: Analyzer, cls: ClassInfo) -> dict[str, str]:
        """Members of ``cls`` that code the checker does not follow may replace, each with that
        code's source (``"*"``: any member): what an analysed class decorator assigns on the class
        it is given — directly, through an alias or through a helper it passes the class to — or
        anything when it returns another class or is not a plain function; what an analysed base's
        ``__init_subclass__`` assigns; anything when an analysed metaclass builds the class."""
        found = self._class_patches.get(cls)
        if found is not None:
            return found
        found = self._class_patches[cls] = {}  # filled below; a lookup from inside sees none yet
        for text, decorator in self.analysed_decorators(cls.node, cls.module):
            target = decorator.info.node if isinstance(decorator, Func) else None
            params = [*target.args.posonlyargs, *target.args.args] if isinstance(target, ast.FunctionDef | ast.Lambda) else []
            frame = self.module_frame(self.sources.module(cls.module))
            if not params or self.call(frame, decorator, (ClassRef(cls),), (), cls.node) != ClassRef(cls):
                found.setdefault("*", text)
                continue
            for name in self.assigned_on(target, params[0].arg, decorator.info.module):  # type: ignore[union-attr]
                found.setdefault(name, text)
        for base in self.mro(cls)[1:]:
            if isinstance(base, ClassInfo):
                hook = next((s for s in base.node.body if isinstance(s, ast.FunctionDef) and s.name == "__init_subclass__"), None)
                params = [*hook.args.posonlyargs, *hook.args.args] if hook is not None else []
                for name in self.assigned_on(hook, params[0].arg, base.module) if params else ():
                    found.setdefault(name, f"{base.dotted}.__init_subclass__")
        for klass in self.mro(cls):
            meta = next((k.value for k in klass.node.keywords if k.arg == "metaclass"), None) if isinstance(klass, ClassInfo) else None
            if meta is not None and isinstance(self.eval(self.module_frame(self.sources.module(klass.module)), meta), ClassRef):
                found.setdefault("*", f"metaclass {ast.unparse(meta)}")
        return found

    def assigned_on(self: Analyzer, func: ast.AST, name: str, module: str, depth: int = 0) -> set[str]:
        """Attribute names ``func``'s body assigns on the object its parameter ``name`` holds —
        directly, through a local alias, or in an analysed helper it passes the object to
        (``"*"`` for a computed name)."""
        aliases = {name} | {
            t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id == name
            for t in n.targets if isinstance(t, ast.Name)
        }
        out: set[str] = set()
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in aliases}
            if not isinstance(node, ast.Call):
                continue
            passed = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id in aliases]
            if not passed:
                continue
            if isinstance(node.func, ast.Name) and node.func.id == "setattr" and passed[0] == 0 and len(node.args) >= 2:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                    out.add(attr.value)
                else:  # setattr(cls, KEY, ...) with a module-level string constant
                    constant = self.module_constant(module, attr.id) if isinstance(attr, ast.Name) else None
                    out.add(constant if constant is not None else "*")
                continue
            if depth >= 3:  # handed on and on: what the last helper does is not read
                out.add("*")
                continue
            helper = self.eval(self.module_frame(self.sources.module(module)), node.func)
            if isinstance(helper, Func) and isinstance(helper.info.node, ast.FunctionDef):
                params = [*helper.info.node.args.posonlyargs, *helper.info.node.args.args]
                for index in passed:
                    if index < len(params):
                        out |= self.assigned_on(helper.info.node, params[index].arg, helper.info.module, depth + 1)
        return out

    def code_handed_out(self: Analyzer, frame: Frame, callee: str, args: tuple[Value, ...],
                        kwargs: tuple[tuple[str, Value], ...], code: list[Value], node: ast.AST,
                        *, always: bool = False, method: bool = False) -> Unknown | None:
        """Analysed ``code`` handed to external ``callee`` (a wrapper, a thread pool's ``submit``, a
        ``Thread``'s target): it runs out of sight, so where it can reach the step's ids — handed
        them, closing over them, bound to an object holding them, or under a scope that may hold
        them — the route is ``unknown``. Returns the unknown result (``None`` where nothing is
        reached and ``always`` is off).

        ``method`` (a method of an external object, ``pool.submit(job)``): only the forward input
        and its tokens count, as for any other argument of such a method
        (:meth:`input_to_external_method`) — not ids already read (their read was judged where it
        stands) nor a scope the checker cannot read (transformers publishes an output collector
        around every layer call, whose checkpointing function receives the layer as code)."""
        reaches = self.reaches_beside_its_arguments(frame, code, method=method) or any(
            carries_tokens(v, ids=not method) for v in (*args, *(v for _, v in kwargs))
        )
        if not (reaches or always):
            return None
        hidden = self.unknown(
            frame, f"analysed code is handed to {callee}, which {HIDDEN} "
            "(torch.compile, checkpoint, threads and other wrappers)", node,
        )
        if reaches:
            self.unresolved(frame, hidden, node)
        return hidden

    def reaches_beside_its_arguments(self: Analyzer, frame: Frame, code: list[Value], *, method: bool) -> bool:
        """Whether ``code`` handed out can reach the step's ids other than through the arguments it
        is handed: closing over them, bound to an object holding them, or under a scope that may
        hold them (``method``: only the input and its tokens count; see :meth:`code_handed_out`)."""
        ids = not method
        scope = any(carries_tokens(v, ids=False) for v in frame.published.values()) if method else self.scope_carries_tokens(frame)
        return scope or any(code_reaches_tokens(c, ids=ids) for c in code)

    def thread_job(self: Analyzer, frame: Frame, runner: str, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...],
                   node: ast.AST, *, method: bool) -> Value | None:
        """A job handed to a thread runner with its arguments (``pool.submit(fn, inp)``,
        ``Thread(target=fn, args=(inp,))``), followed as the call the runner makes (see
        :mod:`~tokenstate.checker.thread_jobs`); returns what the runner's call gives. ``None``
        where ``runner`` is none, the job is not analysed code, or it reaches the step's ids beside
        its arguments: a thread sees its own scope, and RCK-48 keeps such a job ``unknown``."""
        call = thread_job_call(runner, args, kwargs)
        if call is None or not isinstance(call.job, Func | Partial):
            return None
        if self.reaches_beside_its_arguments(frame, [call.job], method=method):
            return None
        if call.gives == "map":
            return Seq(None, self.call(frame, call.job, tuple(element_of(a) for a in call.args), (), node))
        result = self.call(frame, call.job, call.args, call.kwargs, node)
        if call.gives == "future":
            return Pending(result)
        return External(runner, instance=True) if call.gives == "thread" else result

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
        if dotted == "torch.any" and args and args[0] == STALE_MASK:  # torch.any(inp.host_tokens.stale)
            return STALE_ROWS
        if dotted == "contextlib.suppress":  # a manager that swallows exceptions (see may_swallow)
            return External(dotted, instance=True)
        derived = join(*(taint(v) for v in (*args, *(v for _, v in kwargs))))
        if func.instance:
            return derived
        name = dotted.rpartition(".")[2]
        first = args[0] if args else OPAQUE
        if dotted.startswith("builtins.") and name in _ITERATING_BUILTINS:
            first = self.as_iterated(first)  # list(meta), enumerate(meta): a NamedTuple's fields
        if dotted == "functools.partial" and args:
            return Partial(args[0], args[1:], kwargs)
        if dotted in _TEXT_RUNNERS:  # eval("inp.host_tokens.ids"): text run with the caller's locals
            text = self.unknown(frame, f"{name}() runs code given as text, which the checker does not read", node)
            if any(carries_tokens(v) for v in (*frame.env.values(), *args)) or self.scope_carries_tokens(frame):
                self.unresolved(frame, text, node)
            return text
        if (dotted.startswith("torch.ops.") and dotted.split(".")[2] not in _KERNEL_NAMESPACES
                and any(_host_ids_in(v) for v in frame.published.values())):
            # torch.ops.ns.op(...): a Python function registered with torch.library (Library.impl,
            # vLLM's direct_register_custom_op) may read the ids this call left in a module-level
            # buffer or cell (a scope publishing the forward input or metadata hands it none itself)
            op = self.unknown(
                frame, f"{dotted} is a custom op whose registered implementation the checker does not follow, "
                "called after ids were kept where it may read them (a module-level buffer or cell)", node,
            )
            self.unresolved(frame, op, node)
            return op
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
                parts = tuple(self.iterated(a) for a in args)
                return Seq(None, Seq(parts, join(*parts)))
            if name in ("list", "tuple") and isinstance(first, Seq) and first.items is not None:
                return Seq(first.items, first.elem)  # tuple(meta)[1]: the items, in order
            if name == "reversed" and isinstance(first, Seq) and first.items is not None:
                return Seq(first.items[::-1], first.elem)
            if name in _SEQ_BUILTINS:
                return Seq(None, element_of(first)) if args else Seq((), OPAQUE)
            if name == "next":
                return element_of(first)
            if name == "map" and args:
                results = self.call(frame, first, tuple(self.iterated(a) for a in args[1:]), (), node)
                return Seq(None, results)
            if name == "dict":
                # dict(wte=...) keeps its constant keys (nanoGPT's ModuleDict(dict(wte=..., h=...)))
                known = first.items if isinstance(first, MapV) else (None if args else ())
                items = None if known is None else (*known, *kwargs)
                return MapV(join(_dict_values(first), *(v for _, v in kwargs)), items)
        if dotted in ("itertools.islice", "itertools.chain", "itertools.cycle") and args:
            # islice(self.layers, start, end) (vLLM's pipeline stages): some of the items of its
            # first argument; chain(a, b): the items of each
            sources = args if name == "chain" else args[:1]
            return Seq(None, join(*(element_of(a) for a in sources)))
        if name in ("ModuleList", "ParameterList"):
            return Seq(first.items, first.elem) if isinstance(first, Seq) else Seq((), OPAQUE)
        if name == "Sequential":
            return Seq(args, join(*args), pipeline=True)
        if name in ("ModuleDict", "ParameterDict", "OrderedDict"):
            return MapV(first.values, first.items) if isinstance(first, MapV) else MapV(OPAQUE)
        if dotted in _COPIES and args:
            return first
        if dotted in _REPLACES and isinstance(first, Input) and not {k for k, _ in kwargs} & _TOKEN_FIELDS:
            return first  # dataclasses.replace(inp, positions=...): a new input with the step's tokens
        if dotted == "typing.cast" and len(args) == 2:
            return args[1]
        if dotted == "types.MethodType" and len(args) == 2 and isinstance(first, Func) and first.bound is None:
            return Func(first.info, args[1], first.closure, first.raw)  # a method bound by hand
        code = [v for v in (*args, *(v for _, v in kwargs)) if is_code(v)]
        if code:
            # torch.compile(model), checkpoint(layer, ids), vmap(f), Thread(target=f)...: the callee
            # runs our code where the analysis cannot follow it; its result is unknown
            if name in FORWARD_HOOKS:  # torch.nn.modules.module.register_module_forward_pre_hook(f)
                self.forward_hook(frame, name, code, node)
                return self.unknown(frame, f"analysed code is handed to {dotted}, which {HIDDEN}", node)
            followed = self.thread_job(frame, dotted, args, kwargs, node, method=False)
            if followed is not None:
                return followed
            return self.code_handed_out(frame, dotted, args, kwargs, code, node, always=True)  # type: ignore[return-value]
        if dotted.endswith("DeviceTokens.from_host"):
            if isinstance(first, Tokens) and first.kind == "host":  # the upload reads host.ids, which raises on a stale step
                self.host_read(frame, host_kind(frame, first), "DeviceTokens.from_host(inp.host_tokens)", node)
                return first  # an upload of host ids: only as fresh as the host ids themselves
            return Tokens("host")
        self.input_handed_out(frame, dotted, args, kwargs, node, modeled=dotted)  # its route: unknown
        if name[:1].isupper():
            return External(dotted, instance=True)
        owner = dotted.rpartition(".")[0]
        if name in ALTERNATE_CONSTRUCTORS and owner.rpartition(".")[2][:1].isupper():
            return External(owner, instance=True)  # nn.Embedding.from_pretrained(w): an nn.Embedding
        return derived


def _dict_values(source: Value) -> Value:
    """The values of ``dict(source)``: a mapping's own, or — from pairs (``dict(zip(meta._fields,
    meta))``, ``dict(items)``) — any part of each pair."""
    if isinstance(source, MapV):
        return source.values
    return element_of(element_of(source)) if isinstance(source, Seq) else OPAQUE


def _host_ids_in(value: Value) -> bool:
    """Whether ``value`` holds host ids (fresh here or not): what a custom op reading it later may
    find stale. Device ids kept (``buf[:n].copy_(inp.embedding_ids())``) are the step's real ids."""
    flowing = taint(value)  # what flows from it: a list's items, a container's values...
    return any(
        isinstance(v, Ids) and any(o.kind != "device" for o in v.origins)
        for v in getattr(flowing, "options", (flowing,))
    )
