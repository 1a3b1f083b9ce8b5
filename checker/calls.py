"""Calls: interprocedural analysis with memoised summaries, constructors, sinks and context managers.

A call to analysed code is analysed in the caller's abstract context (argument values, published
scopes, whether host ids are known fresh) and summarised once per context; the summary's events are
re-rooted at the call site, which is how a route ``entry → … → sink`` keeps its file:line chain.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from tokenstate.checker.evaluate import STATE_DUMPS, element_of, host_kind, is_stale_test
from tokenstate.checker.frame import RESULT_CACHES, Event, Frame, Summary, cached_cell
from tokenstate.checker.guards import STALE_ROWS, expression_path, fresh_row_fact
from tokenstate.checker.resolve import decorator_names
from tokenstate.checker.values import (
    NAMED_SETTERS,
    NO_KEY,
    NONE_WITHOUT_DEVICE_IDS,
    OPAQUE,
    RECORD_METHODS,
    RETURNS_SELF,
    SUBMODULE_PATHS,
    SUBMODULE_WALKS,
    Alt,
    Bound,
    Cell,
    ClassInfo,
    ClassRef,
    External,
    Flag,
    Func,
    GenCM,
    Ids,
    Input,
    Instance,
    MapV,
    Partial,
    Pending,
    Seq,
    Super,
    Tokens,
    Unknown,
    Value,
    carries_tokens,
    has_ids,
    join,
    read_without_device_ids,
    stored_beyond_the_call,
    taint,
    with_item,
    with_writes,
)

if TYPE_CHECKING:
    from tokenstate.checker.engine import Analyzer

__all__ = [
    "FORWARD_HOOK", "FORWARD_HOOKS", "HOST_READ", "RAW_READ", "SPREAD", "CallMixin", "code_reaches_tokens", "is_code",
    "kwarg_value",
]  # fmt: skip

MAX_DEPTH = 64
SPREAD = "**"
"""Keyword name of a ``**mapping`` argument whose keys are not known constants."""

HOST_READ = "reads host ids (raises StaleHostTokensError on a step with spliced rows)"
RAW_READ = "reads the raw host buffer (PLACEHOLDER at every spliced position)"


def kwarg_value(kwargs: tuple[tuple[str, Value], ...], names: tuple[str, ...]) -> Value | None:
    """The argument passed by one of the keyword ``names`` (or through an unknown ``**`` spread)."""
    found = next((v for k, v in kwargs if k in names), None)
    return found if found is not None else next((v for k, v in kwargs if k == SPREAD), None)


class CallMixin:
    def decorators(self: Analyzer, func: Func) -> set[str]:
        return decorator_names(func.info.node)

    def current(self: Analyzer, frame: Frame, inst: Instance, depth: int = 0) -> Instance:
        """``inst`` with the attributes this frame's calls have assigned on its class since
        construction, and so the objects its fields hold (``model.input_ids.gpu[:n].copy_(ids)``,
        then ``model.run()`` reads ``self.input_ids.gpu``: the callee gets the model as it is now)."""
        inst = with_writes(inst, frame.obj_writes.get(inst.info, {}))
        if not frame.obj_writes or depth >= _NESTING:
            return inst
        fields = tuple((k, self.current(frame, v, depth + 1) if isinstance(v, Instance) else v) for k, v in inst.fields)
        return inst if fields == inst.fields else Instance(inst.info, fields)

    def filled_result(self: Analyzer, frame: Frame, target: ast.expr) -> Value:
        """What an in-place write (``buf[:n].copy_(ids)``) returns: the tensor it filled."""
        return self.eval(frame, target)

    def sink(self: Analyzer, frame: Frame, desc: str, ids: Value, node: ast.AST) -> None:
        if frame.fresh:  # no device ids on this path: any host ids embedded here are this call's
            ids = read_without_device_ids(ids)
        if has_ids(ids) or isinstance(taint(ids), Unknown) or any(
            isinstance(v, Unknown) for v in getattr(taint(ids), "options", ())
        ):
            frame.add_event(Event("sink", taint(ids), desc, (frame.hop(getattr(node, "lineno", 0)),)))

    def host_read(self: Analyzer, frame: Frame, kind: str, what: str, node: ast.AST) -> Ids:
        """Host ids read at ``node``: outside a freshness guard the read itself is a finding,
        whatever the ids are then used for (only the embedding counting was the old blind spot)."""
        ids = self.origin(frame, kind, what, node)
        if kind != "host_fresh":
            desc = RAW_READ if kind == "host_raw" else HOST_READ
            frame.add_event(Event("sink", ids, desc, (frame.hop(getattr(node, "lineno", 0)),)))
        return ids

    def constant_names(self: Analyzer, frame: Frame, expr: ast.expr) -> tuple[str, ...] | None:
        """The attribute names a ``getattr`` may read, where they are fixed: see :meth:`key_choices`
        (``None`` when any of them is not a string)."""
        choices = self.key_choices(frame, expr)
        return choices if choices is not None and all(isinstance(c, str) for c in choices) else None  # type: ignore[return-value]

    def key_choices(self: Analyzer, frame: Frame, expr: ast.expr) -> tuple[object, ...] | None:
        """The constants ``expr`` may be, where they are fixed: a literal; a local every binding of
        which is a literal, a loop over a literal list of them (``for name in ["use_cache", ...]``,
        transformers' config defaults) or ``getattr(obj, "attr", "default")`` on a class
        constant; a module-level string constant; a class-level one read through ``self`` or the
        class. ``None`` when it may be anything."""
        if isinstance(expr, ast.Constant):
            return (expr.value,)
        if isinstance(expr, ast.Name):
            if frame.func is not None and (expr.id in frame.env or expr.id in frame.closure):
                return self.local_choices(frame, expr.id)
            constant = self.module_constant(frame.module.name, expr.id)  # KEY = "embed_tokens"
            return None if constant is None else (constant,)
        name = self.constant_name(frame, expr)
        return None if name is None else (name,)

    def local_choices(self: Analyzer, frame: Frame, name: str) -> tuple[object, ...] | None:
        """What a local may be when every binding of it in the function is a literal, a loop over a
        literal list, or a fixed ``getattr`` (see :meth:`key_choices`); any other binding of it —
        a parameter, an import, a ``def``, an ``except``/``match``/``with`` name, ``global`` — and
        it may be anything (``None``)."""
        assert frame.func is not None
        node = frame.func.node
        if isinstance(node, ast.Lambda) or name in {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}:
            return None
        choices: list[object] = []
        understood: set[int] = set()  # the Name nodes of the bindings read below
        for site in ast.walk(node):
            if isinstance(site, ast.For | ast.comprehension) and isinstance(site.target, ast.Name) and site.target.id == name:
                items = _literal_items(site.iter, node)
                if items is None:
                    return None
                choices += items
                understood.add(id(site.target))
            elif isinstance(site, ast.Assign) and len(site.targets) == 1 and isinstance(site.targets[0], ast.Name) and site.targets[0].id == name:
                fixed = self.fixed_value(frame, site.value)
                if fixed is None:
                    return None
                choices += fixed
                understood.add(id(site.targets[0]))
            elif _binds_otherwise(site, name, node):
                return None
        stores = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
        if any(id(n) not in understood for n in stores):
            return None  # x, y = ..., x += 1, del x, a tuple target...
        return tuple(dict.fromkeys(choices)) or None

    def fixed_value(self: Analyzer, frame: Frame, value: ast.expr) -> list[object] | None:
        """A literal, or ``getattr(obj, "attr", "default")`` on a class constant (else ``None``)."""
        if isinstance(value, ast.Constant):
            return [value.value]
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "getattr"
                and len(value.args) in (2, 3) and isinstance(value.args[1], ast.Constant)):
            constant = self.constant_name(frame, ast.Attribute(value.args[0], value.args[1].value, ast.Load()))
            if constant is not None:
                return [constant]
            if len(value.args) == 3 and isinstance(value.args[2], ast.Constant):
                return [value.args[2].value]
        return None

    def constant_name(self: Analyzer, frame: Frame, expr: ast.expr) -> str | None:
        """The class-level string constant ``expr`` (``self.X`` / ``Class.X``) reads, where no
        instance or method rebinds it (literals and names: :meth:`key_choices`)."""
        if not isinstance(expr, ast.Attribute):
            return None
        owner = self.eval(frame, expr.value)
        if isinstance(owner, Instance):
            if owner.field(expr.attr) is not None or (owner == frame.self_value and expr.attr in frame.self_writes):
                return None  # set per instance: not the class's constant
            info = owner.info
        elif isinstance(owner, ClassRef):
            info = owner.info
        else:
            return None
        if self.class_cell_for(info, expr.attr) is not None:
            return None  # a method rebinds it on the class
        return self.class_constant(info, expr.attr)

    def lookup(self: Analyzer, frame: Frame, mapping: MapV, key: ast.expr | None) -> Value:
        """``mapping[key]``: the entries its key may name (:meth:`key_choices`), else any value."""
        choices = None if key is None else self.key_choices(frame, key)
        return mapping.values if choices is None else join(*(mapping.lookup(c) for c in choices))

    def scope_carries_tokens(self: Analyzer, frame: Frame) -> bool:
        """Whether a scope published here holds the forward input or ids: code the checker cannot
        see may read it (a published scope of positions or attention metadata hands it none)."""
        return any(carries_tokens(v) or isinstance(v, Unknown) for v in frame.published.values())

    def forward_hook(self: Analyzer, frame: Frame, registration: str, hooks: list[Value], node: ast.AST) -> None:
        """Analysed code registered as a forward hook: torch runs it inside a module's call, with
        whatever the model holds then. A plain function (not a method: the model's state at
        forward time is not what it is here) that holds neither the input nor an object that may
        hold it, and whose trial reaches nothing but stores of what it is given into containers
        the checker cannot read (transformers' ``requires_grad_`` and output-capturing hooks; see
        :func:`_only_stores`) — not into a module-level list or an object the forward may read
        back — cannot change what the forward embeds; any other is an ``unknown`` route, kept even
        when the model's construction registered it."""
        scratch = Frame(frame.func, frame.module, frame.file, {}, dict(frame.published), False, frame.depth)
        arity = 2 if "pre" in registration else 3  # (module, args) / (module, args, output)
        plain = all(
            isinstance(h, Func) and h.bound is None
            and not any(carries_tokens(v) or isinstance(v, Instance | Unknown) for _, v in _free_values(h))
            for h in hooks
        )  # fmt: skip
        for hook in hooks if plain else ():
            # a container it closes over may be filled by the forward before torch runs it
            self.call(scratch, _filled_by_the_forward(hook), hook_arguments(arity), (), node)  # type: ignore[arg-type]
        kept = [*scratch.writes.values(), *(v for w in scratch.obj_writes.values() for v in w.values())]
        if plain and _only_stores(scratch.events.values()) and not any(carries_tokens(v, ids=False) for v in kept):
            return  # what it stores, it stores out of the forward's reach
        hook = self.unknown(frame, f"registers a forward hook ({registration}) that reads host ids or hands the input to code out of the checker's sight", node)
        frame.add_event(Event("unresolved", hook, FORWARD_HOOK, (frame.hop(getattr(node, "lineno", 0)),)))

    def unresolved(self: Analyzer, frame: Frame, callee: Unknown, node: ast.AST, *, sink: str = "call") -> None:
        frame.add_event(Event("unresolved", callee, sink, (frame.hop(getattr(node, "lineno", 0)),)))

    def spelt_attribute_read(self: Analyzer, frame: Frame, node: ast.Call) -> Value | None:
        """``x.__getattribute__("name")``: the attribute read it is, spelt as a call (else None)."""
        if isinstance(node.func, ast.Attribute) and node.func.attr == "__getattribute__" and len(node.args) == 1:
            return self.read_named_attribute(frame, self.eval(frame, node.func.value), node.args[0], (), node)
        return None

    def eval_call(self: Analyzer, frame: Frame, node: ast.Call) -> Value:
        read = self.spelt_attribute_read(frame, node)
        if read is not None:
            return read
        func = self.eval(frame, node.func)
        args: list[Value] = []
        for arg in node.args:
            value = self.eval(frame, arg.value if isinstance(arg, ast.Starred) else arg)
            if isinstance(arg, ast.Starred):
                value = self.as_iterated(value)  # f(*meta): a NamedTuple's fields in order
                args += value.items if isinstance(value, Seq) and value.items is not None else [element_of(value)]
            else:
                args.append(value)
        kwargs = self.keywords(frame, node.keywords)
        if func == External("builtins.isinstance") and len(node.args) == 2:
            return self.flag_of(frame, node) or OPAQUE
        if func == External("builtins.bool") and args and isinstance(args[0], Flag):
            return args[0]
        if isinstance(func, External) and func.dotted in ("importlib.import_module", "builtins.__import__"):
            return self.import_module(frame, func.dotted, node)
        if func in (External("builtins.getattr"), External("builtins.object.__getattribute__")) and len(node.args) >= 2:
            return self.read_named_attribute(frame, args[0], node.args[1], args[2:], node)
        if func == External("builtins.super"):
            if args:
                owner = args[0].info if isinstance(args[0], ClassRef) else None
                receiver = args[1] if len(args) > 1 else OPAQUE
            else:
                owner = frame.func.owner if frame.func is not None else None
                receiver = frame.self_value or OPAQUE
            return Super(owner, receiver) if isinstance(owner, ClassInfo) else self.unknown(frame, "super() outside a method", node)
        if func == External("builtins.setattr") and len(node.args) == 3:
            names = self.constant_names(frame, node.args[1])
            if names is not None and len(names) == 1:  # setattr(obj, "name", v): the assignment it spells
                self.assign(frame, ast.Attribute(value=node.args[0], attr=names[0], ctx=ast.Store()), args[2])
                return OPAQUE
            if _instances(args[0]) and _instances(args[2]):
                self.replace_some_submodule(frame, node.args[0], args[0], args[2], node.args[1])
                return OPAQUE
        if isinstance(func, Bound) and func.name == "apply" and isinstance(func.base, Instance) and len(args) == 1 and is_code(args[0]):
            # model.apply(fn), nn.Module's: fn is called on every submodule, then on the model
            model = func.base
            for module in (*(v for _, v in self.current(frame, model).fields if isinstance(v, Instance)), model):
                self.call(frame, args[0], (self.current(frame, module),), (), node)
            return model
        setter = node.func.attr in NAMED_SETTERS and len(node.args) >= 2 if isinstance(node.func, ast.Attribute) else False
        if setter and _instances(owner := self.eval(frame, node.func.value)):  # an analysed object (any of those it may be)
            names = self.constant_names(frame, node.args[0])
            if names is not None and len(names) == 1:  # module.register_buffer("name", t): module.name = t
                self.assign(frame, ast.Attribute(value=node.func.value, attr=names[0], ctx=ast.Store()), args[1])
                return OPAQUE
            if names is None and self.replaced_by_a_computed_name(frame, node.func.value, owner, node.args[0], args[1]):
                return OPAQUE  # module.add_module(name, Wrapper()) in a replacement pass
        if isinstance(node.func, ast.Attribute) and node.func.attr in IN_PLACE_WRITES:
            # buf[:n].copy_(ids), buf.index_copy_(0, i, ids); called unbound on the class
            # (torch.Tensor.copy_(buf, ids)), the tensor written into is the first argument
            unbound = isinstance(func, External) and func.dotted == f"torch.Tensor.{node.func.attr}" and bool(node.args)
            target, given = (node.args[0], args[1:]) if unbound else (node.func.value, args)
            written = join(*(taint(v) for v in given), *(taint(v) for _, v in kwargs))
            if has_ids(written):
                self.write_into(frame, target, written)
                return self.filled_result(frame, target)
        if isinstance(func, External) and func.dotted in WRITING_FUNCTIONS and node.args:
            # np.copyto(buf[:n], ids), np.put(buf, idx, ids): the first argument is written into
            written = join(*(taint(v) for v in args[1:]), *(taint(v) for _, v in kwargs))
            if has_ids(written):
                self.write_into(frame, node.args[0], written)
                return OPAQUE
        result = self.call(frame, func, tuple(args), kwargs, node)
        out = next((kw.value for kw in node.keywords if kw.arg == "out"), None)
        if out is not None:  # torch.index_select(ids, 0, idx, out=buf): buf holds them
            written = join(*(taint(v) for v in args), *(taint(v) for k, v in kwargs if k != "out"))
            if has_ids(written):
                self.write_into(frame, out, written)
        return result

    def read_named_attribute(self: Analyzer, frame: Frame, base: Value, name_expr: ast.expr, default: tuple[Value, ...], node: ast.Call) -> Value:
        """``getattr(base, name[, default])`` and ``base.__getattribute__(name)``: the attribute,
        where ``name`` is fixed (see :meth:`constant_name`); else unknown (dynamic dispatch)."""
        names = self.constant_names(frame, name_expr)
        if names is None:
            return self.unknown(frame, "getattr() with a computed name (dynamic dispatch)", node)
        if base == Tokens("device") and names == ("ids",) and default and default[0] == OPAQUE:
            # getattr(inp.device_tokens, "ids", None): the default exactly when there are no device ids
            return join(self.attribute(frame, base, "ids", node), NONE_WITHOUT_DEVICE_IDS)
        found = [self.attribute(frame, base, name, node) for name in names]
        return join(*(join(f, default[0]) if default and isinstance(f, Unknown) else f for f in found))

    def keywords(self: Analyzer, frame: Frame, keywords: list[ast.keyword]) -> tuple[tuple[str, Value], ...]:
        """Keyword arguments; ``**mapping`` expands to its constant keys, else to :data:`SPREAD`."""
        out: list[tuple[str, Value]] = []
        for kw in keywords:
            value = self.eval(frame, kw.value)
            options = getattr(value, "options", (value,))
            if kw.arg is not None:
                out.append((kw.arg, value))
            elif all(isinstance(o, MapV) and o.items is not None and all(isinstance(k, str) for k, _ in o.items) for o in options):
                # **kwargs, or one of several dicts with known keys: each key with what it may hold
                keys = dict.fromkeys(str(k) for o in options for k, _ in o.items)  # type: ignore[union-attr]
                out += [(k, join(*(o.lookup(k) for o in options if any(key == k for key, _ in o.items)))) for k in keys]  # type: ignore[union-attr]
            else:
                out.append((SPREAD, value.values if isinstance(value, MapV) else taint(value)))
        return tuple(out)

    def call(self: Analyzer, frame: Frame, func: Value, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Value:
        if hasattr(func, "options"):
            return join(*(self.call(frame, o, args, kwargs, node) for o in func.options))  # type: ignore[attr-defined]
        if isinstance(func, Func):
            wrapper = self.opaque_wrapper(func)
            if wrapper is not None:
                hidden = self.unknown(
                    frame, f"{func.info.dotted} is wrapped by @{wrapper}, whose compiled or captured code the "
                    "checker does not follow", node,
                )
                return self.call(frame, hidden, args, kwargs, node)
            if "contextmanager" in self.decorators(func):
                return GenCM(func, args, kwargs)
            applied = self.decorated(frame, func, node)
            if applied != func:
                return self.call(frame, applied, args, kwargs, node)
            ret = self.invoke(frame, func, args, kwargs, node).ret
            if self.decorators(func) & RESULT_CACHES:  # a later call may get this call's result
                # ... and what was written into it since: step_buffer(n)[:k].copy_(ids)
                return join(stored_beyond_the_call(ret), frame.published.get(cached_cell(func.info)))
            return ret
        if isinstance(func, ClassRef):
            return self.instantiate(frame, func.info, args, kwargs, node)
        if isinstance(func, Instance):
            return self.call_instance(frame, self.current(frame, func), args, kwargs, node)
        if isinstance(func, Partial):
            return self.call(frame, func.target, func.args + args, func.kwargs + kwargs, node)
        if isinstance(func, Seq) and func.pipeline:
            value = args[0] if args else OPAQUE
            for item in func.items or (func.elem,):
                value = self.call(frame, item, (value,), (), node)
            return value
        if isinstance(func, External):
            return self.call_external(frame, func, args, kwargs, node)
        if isinstance(func, Bound):
            return self.call_bound(frame, func, args, kwargs, node)
        if isinstance(func, Unknown) or func == OPAQUE:
            # An unresolved callee may embed ids it is given, or read a published scope; plain
            # data called as a function (an activation table entry...) only matters with ids.
            with_ids = any(carries_tokens(v) for v in (*args, *(v for _, v in kwargs)))
            if with_ids or (isinstance(func, Unknown) and self.scope_carries_tokens(frame)):
                callee = func if isinstance(func, Unknown) else self.unknown(
                    frame, "calls a value the checker cannot resolve (a parameter or data, not a function)", node
                )
                self.unresolved(frame, callee, node)
            return func
        return OPAQUE

    def call_instance(self: Analyzer, frame: Frame, inst: Instance, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Value:
        sink = self.sink_base(inst.info)
        if sink is not None:
            spec = self.sink_modules[sink]
            ids = args[spec.ids_index] if len(args) > spec.ids_index else kwarg_value(kwargs, spec.ids_keywords)
            self.sink(frame, f"{inst.info.dotted}(ids) [{sink}]", ids or OPAQUE, node)
            return OPAQUE
        rebound = self.rebound_forward(frame, inst)
        if rebound is not None:
            return self.call(frame, rebound, args, kwargs, node)
        member = None
        for name in ("__call__", "forward"):
            member = self.class_member(inst.info, name)
            if member is not None and isinstance(member[0], Func | Unknown):  # unknown: a class decorator assigned it
                return self.call(frame, self.bind_member(frame, member[0], inst, node), args, kwargs, node)
        if member is not None and isinstance(member[0], External):  # the last one looked up: forward
            # class MissingLayer(nn.Identity): the external base's forward, as an external object's
            owner = member[0].dotted.rpartition(".")[0]
            return self.call(frame, Bound(External(owner, instance=True), "forward"), args, kwargs, node)
        return self.call(frame, self.unknown(frame, f"{inst.info.dotted} instance is not callable", node), args, kwargs, node)

    def rebound_forward(self: Analyzer, frame: Frame, inst: Instance) -> Value | None:
        """The code ``module.forward = fn`` put on the instance: nn.Module's ``__call__`` calls
        ``self.forward``, which finds the instance's own attribute first (a class with its own
        ``__call__`` runs that instead). None where none was set."""
        rebound = self.current(frame, inst).field("forward")
        own_call = self.class_member(inst.info, "__call__")
        if rebound is None or not is_code(rebound) or (own_call is not None and isinstance(own_call[0], Func)):
            return None
        return rebound

    def call_bound(self: Analyzer, frame: Frame, func: Bound, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Value:
        base, name = func.base, func.name
        if is_stale_test(base, name):
            return STALE_ROWS  # inp.host_tokens.stale.any() (.item()): a stale-rows test
        if isinstance(base, Input) and name == "embedding_ids":
            return self.origin(frame, "device", "inp.embedding_ids()", node)
        host = isinstance(base, Tokens) and base.kind == "host"
        if host and name == "row_ids":
            row = expression_path(node.args[0]) if isinstance(node, ast.Call) and node.args else None
            kind = "host_fresh" if row is not None and fresh_row_fact(row) in frame.narrow else host_kind(frame, base)
            return self.host_read(frame, kind, "inp.host_tokens.row_ids()", node)
        if host and name == "placeholder_buffer":
            return self.host_read(frame, "host_raw", "inp.host_tokens.placeholder_buffer()", node)
        if host and name in STATE_DUMPS:  # the slots' state: the raw buffer, placeholders in
            return Seq(None, self.host_read(frame, "host_raw", f"inp.host_tokens.{name}()", node))
        if isinstance(base, Instance) and name in RETURNS_SELF:
            return base
        if isinstance(base, Instance) and name in SUBMODULE_WALKS:
            return self.submodules(frame, base, name)
        if isinstance(base, Instance) and name in SUBMODULE_PATHS and isinstance(node, ast.Call) and node.args and args:
            return self.submodule_at(frame, base, name, node, args)
        if isinstance(base, Instance) and name in RECORD_METHODS and (fields := self.record_fields(base.info)) is not None:
            stored = [(f.name, base.field(f.name) or OPAQUE) for f in fields if f.stored]
            if name == "_asdict":  # meta._asdict()["tokens"]: its fields by name
                return MapV(join(*(v for _, v in stored)), tuple(stored))
            replaced = dict(stored) | {k: v for k, v in kwargs if k in dict(stored)}  # meta._replace(tokens=...)
            return Instance(base.info, tuple(sorted(replaced.items(), key=lambda kv: kv[0])))
        if isinstance(base, Pending):  # the future of a followed thread job
            if name == "result":
                return base.result
            base = External("concurrent.futures.Future", instance=True)  # its other methods, as any future's
        if isinstance(base, Cell):
            if name in ("set", "append", "insert") and args:
                frame.write_cell(base.name, args[-1])
                return OPAQUE
            if name in ("get", "pop"):
                return self.read_cell(frame, base.name, node)
            return OPAQUE
        if isinstance(base, MapV | Seq) and name in _FILLS and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            filled = _filled(base, name, args, kwargs, node)
            if filled is not None and isinstance(node.func.value, ast.Name | ast.Attribute):
                self.fill_in_place(frame, node.func.value, filled)  # the container, filled in place
                if name != "setdefault":
                    return OPAQUE
                base = filled
        if isinstance(base, MapV):
            if name in ("get", "pop", "setdefault"):
                key = node.args[0] if isinstance(node, ast.Call) and node.args else None
                found = self.lookup(frame, base, key)
                return join(found, *args[1:]) if len(args) > 1 else found
            if name == "items":
                return Seq(None, Seq((OPAQUE, base.values), base.values))
            return Seq(None, base.values)
        if isinstance(base, Seq):
            if name in GENERATOR_INPUTS and any(carries_tokens(v, ids=False) for v in (*args, *(v for _, v in kwargs))):
                # into a generator: what its body does with what it receives is not followed
                sent = self.unknown(frame, f"sends the forward input into a generator ({name}()), which the checker does not follow", node)
                self.unresolved(frame, sent, node)
                return sent
            return element_of(base) if name == "pop" else OPAQUE
        gather = dict(self.config.gather_methods).get(name)
        if gather is not None and not isinstance(base, Ids):
            ids = args[gather] if len(args) > gather else kwarg_value(kwargs, ("index",))
            if ids is not None and has_ids(ids):
                self.sink(frame, f"table.{name}(ids) gather", ids, node)
                return OPAQUE
        hooks = [v for v in (*args, *(v for _, v in kwargs)) if is_code(v)]
        if name in FORWARD_HOOKS and hooks:
            # module.register_forward_pre_hook(self.fix_ids): torch runs the hook inside the module's call
            self.forward_hook(frame, name, hooks, node)
            return OPAQUE
        jobs = [h for h in hooks if isinstance(h, Func | Partial)]  # objects passed along are data here
        if jobs and (isinstance(base, External) or base == OPAQUE):  # pool.submit(job), loop.run_in_executor...
            callee = f"{getattr(base, 'dotted', 'an external base class')}.{name}"
            followed = self.thread_job(frame, callee, args, kwargs, node, method=True)
            if followed is not None:
                return followed
            handed = self.code_handed_out(frame, callee, args, kwargs, jobs, node, method=True)
            if handed is not None:
                return handed
        hidden = self.input_to_external_method(frame, base, name, args, kwargs, node)
        if hidden is not None:
            return hidden
        return join(taint(base), *(taint(v) for v in (*args, *(v for _, v in kwargs))))

    def input_to_external_method(self: Analyzer, frame: Frame, base: Value, name: str, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Unknown | None:
        """``unknown`` for a method the checker cannot read (inherited from an external base, or of
        an external object) handed the forward input or its tokens: it may read host ids out of
        sight. ``None`` for any other method call."""
        store = name in _STORES
        if isinstance(base, External):
            return self.input_handed_out(frame, f"{base.dotted}.{name}", args, kwargs, node, modeled=base.dotted, store=store)
        if base == OPAQUE:
            return self.input_handed_out(frame, f"an external base class.{name}", args, kwargs, node, store=store)
        return None

    def input_handed_out(self: Analyzer, frame: Frame, callee: str, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...],
                         node: ast.AST, *, modeled: str | None = None, store: bool = False) -> Unknown | None:
        """Code outside the analysed modules (``callee``) given the forward input or its tokens: an
        unresolved ``unknown`` route, since it may read host ids out of sight. ``None`` when no input
        is handed over, or ``modeled`` names a module the configuration models. ``store``: the
        callee puts what it is given into a container (``collected.append(x)``), its event's sink
        is :data:`STORE`."""
        handed = (o for v in (*args, *(v for _, v in kwargs)) for o in getattr(v, "options", (v,)))
        if not any(isinstance(o, Input | Tokens) for o in handed):
            return None
        if modeled is not None and self.config.is_modeled(modeled):
            return None
        hidden = self.unknown(frame, f"passes the forward input to {callee}, outside the analysed modules", node)
        self.unresolved(frame, hidden, node, sink=STORE if store else "call")
        return hidden

    # ---- analysed functions and classes --------------------------------------------------------

    def invoke(self: Analyzer, frame: Frame, func: Func, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST, *, enter: bool = False) -> Summary:
        if frame.depth >= MAX_DEPTH:
            reason = f"call chain deeper than {MAX_DEPTH} at {func.info.dotted}"
            return Summary(self.unknown(frame, reason, node), (), (), (), None, None)
        key = (func, args, kwargs, frozenset(frame.published.items()), frame.fresh)
        summary = self.memo.get(key)
        if summary is None:
            if key in self.in_progress:  # recursion: the outer analysis of this context covers it
                return Summary(OPAQUE, (), (), (), None, None)
            self.in_progress.add(key)
            try:
                summary = self.analyse(func, args, kwargs, frame.published, frame.fresh, frame.depth + 1)
            finally:
                self.in_progress.discard(key)
            self.memo[key] = summary
        call_hop = frame.hop(getattr(node, "lineno", 0))
        for event in summary.events:
            frame.add_event(Event(event.kind, event.ids, event.sink, (call_hop, *event.hops)))
        for cell, value in (summary.yield_writes or ()) if enter else summary.writes:
            frame.write_cell(cell, value)
        for info, writes in summary.obj_writes:
            frame.record_writes(info, writes)
        if func.bound is not None and (func.bound == frame.self_value or func.bound in frame.self_aliases):
            for name, value in summary.self_writes:
                frame.self_writes[name] = join(frame.self_writes.get(name), value)
            for name, value in summary.lazy_fields:  # self._ensure_staged(): created as the callee created it
                if name not in frame.self_writes:
                    frame.lazy_fields.setdefault(name, value)
        elif isinstance(func.bound, Instance) and not func.info.qualname.endswith(".__init__"):
            # `model.prepare(inp)` then `model.run()`: what prepare assigned on self is seen by run
            frame.record_writes(func.bound.info, summary.self_writes)
        for name, value in summary.param_fills:  # copy_into(model.input_ids, ids): the buffer holds them
            given = _argument_given(func, node, name)
            if given is not None:
                self.write_into(frame, given, value)
        return summary

    def instantiate(self: Analyzer, frame: Frame, cls: ClassInfo, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.AST) -> Value:
        new = self.class_member(cls, "__new__")
        if new is not None and isinstance(new[0], Func) and not _builds_its_own_class(new[0].info.node):
            return self.unknown(
                frame, f"{new[0].info.dotted} may build an instance of another class than {cls.dotted} (a registry "
                "of replacements, as vLLM's PluggableLayer keeps), which the checker does not follow", node,
            )
        member = self.class_member(cls, "__init__")
        fields: dict[str, Value] = {}
        if member is not None and isinstance(member[0], Unknown):  # a class decorator replaced it
            return member[0]
        if member is not None and isinstance(member[0], Func):
            summary = self.invoke(frame, Func(member[0].info, Instance(cls, ())), args, kwargs, node)
            fields = {**dict(summary.lazy_fields), **dict(summary.self_writes)}
        elif (record := self.record_fields(cls)) is not None:
            fields = self.construct_record(frame, cls, record, args, kwargs, node)
        elif args and any(isinstance(k, External) and k.dotted.startswith("builtins.") for k in self.mro(cls)):
            fields = {"args": Seq(args, join(*args))}  # class Carry(Exception): BaseException keeps .args
        return Instance(cls, tuple(sorted(fields.items(), key=lambda kv: kv[0])))

    def replaced_by_a_computed_name(self: Analyzer, frame: Frame, target: ast.expr, owner: Value, name: ast.expr, value: Value) -> bool:
        """``module._modules[name] = Wrapper(child)`` (or ``module.__dict__[name]``,
        ``module.add_module(name, ...)``) with a computed name: :meth:`replace_some_submodule`, where
        ``owner`` (what ``target`` evaluated to) is an analysed object and ``value`` one too (whether it was)."""
        if not (_instances(owner) and _instances(value)):
            return False
        self.replace_some_submodule(frame, target, owner, value, name)
        return True

    def replace_some_submodule(self: Analyzer, frame: Frame, target: ast.expr, owner: Value, value: Value, name: ast.expr | None = None) -> None:
        """``setattr(module, name, Wrapper(child))`` with a computed name, as a module-replacement
        pass writes it (``for name, child in module.named_children(): ...``): each submodule
        ``module`` holds may now be ``value`` instead — ``module`` any of the analysed objects
        ``owner`` may be (``for _, module in model.named_modules():``) — or, where ``name`` is the
        name the walk gave ``child``, only those ``child`` may still be there (the pass's own filter,
        ``if isinstance(child, OtherIds):``, narrowed it)."""
        objects = [o for o in getattr(owner, "options", (owner,)) if isinstance(o, Instance)]
        among = self.partner_classes(frame, name)
        for obj in objects:
            for field, held in self.current(frame, obj).fields:
                if not (isinstance(held, Instance) and (among is None or held.info in among)):
                    continue
                if any(self.related(held.info, new) for new in _instances(value)):
                    if len(objects) == 1:
                        self.assign(frame, ast.Attribute(value=target, attr=field, ctx=ast.Store()), join(held, value))
                    else:
                        frame.record_writes(obj.info, {field: join(held, value)})

    def partner_classes(self: Analyzer, frame: Frame, name: ast.expr | None) -> set[ClassInfo] | None:
        """The classes of the submodule whose walk name ``name`` is (``child`` of ``for name, child in
        module.named_children()``), as narrowed where it is used; None where not known (``name`` not
        such a name, or ``child`` possibly an object the analysis does not model)."""
        partner = frame.partners.get(name.id) if isinstance(name, ast.Name) else None
        if partner is None:
            return None
        options = getattr(child := self.eval(frame, ast.Name(id=partner, ctx=ast.Load())), "options", (child,))
        return {o.info for o in options} if all(isinstance(o, Instance) for o in options) else None

    def submodule_at(self: Analyzer, frame: Frame, model: Instance, method: str, node: ast.Call, args: tuple[Value, ...]) -> Value:
        """``model.get_submodule("stack.source")``: the object at that path; ``model.set_submodule(path,
        module)``: the assignment it spells. A path that is not a fixed string may name any submodule."""
        paths = self.constant_names(frame, node.args[0])
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        parts = paths[0].split(".") if paths is not None and len(paths) == 1 and paths[0] else None
        target: ast.expr | None = receiver
        found: Value = self.current(frame, model)
        for part in parts or ():
            held = found.field(part) if isinstance(found, Instance) else None
            if not isinstance(held, Instance) or target is None:
                parts = None  # not an analysed submodule: any one may be meant
                break
            target, found = ast.Attribute(value=target, attr=part, ctx=ast.Load()), self.current(frame, held)
        if method == "get_submodule":
            return found if parts is not None else self.submodules(frame, model, "modules").elem
        if parts is not None and target is not None and isinstance(target, ast.Attribute) and len(args) > 1:
            self.assign(frame, ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Store()), args[1])
        elif len(args) > 1 and receiver is not None:
            self.replace_some_submodule(frame, receiver, self.submodules(frame, model, "modules").elem, args[1])
        return OPAQUE

    def submodules(self: Analyzer, frame: Frame, model: Instance, walk: str) -> Seq:
        """``model.modules()``, ``named_modules()`` (``model`` and every analysed object below it),
        ``children()`` or ``named_children()`` (the ones it holds), as they are now; a ``named_``
        walk gives ``(name, module)`` pairs."""
        found: list[Instance] = [self.current(frame, model)] if walk in ("modules", "named_modules") else []
        pending, seen = [(model, 0)], {model}
        while pending:
            inst, depth = pending.pop()
            for _, held in self.current(frame, inst).fields:
                for option in _held_objects(held):
                    if option not in seen:
                        seen.add(option)
                        found.append(self.current(frame, option))
                        if walk in ("modules", "named_modules") and depth < _NESTING:
                            pending.append((option, depth + 1))
        module = join(*found)
        return Seq(None, Seq((OPAQUE, module), module) if walk.startswith("named_") else module)

    def related(self: Analyzer, held: ClassInfo, new: ClassInfo) -> bool:
        """Whether an instance of ``new`` may be put in place of one of ``held`` by a replacement
        pass: the two share an analysed class (``HostIds(DeviceIds)``); a LoRA wrapper of an
        ``nn.Linear``, sharing only ``nn.Module``, is not taken to replace an embedding source."""
        return bool({k for k in self.mro(held) if isinstance(k, ClassInfo)} & {k for k in self.mro(new) if isinstance(k, ClassInfo)})

    def record_fields(self: Analyzer, cls: ClassInfo) -> list[RecordField] | None:
        """The generated ``__init__``'s parameters of a dataclass or ``typing.NamedTuple`` class, in
        order: the annotated names of its record bases first (a redefined field keeps its place),
        ``ClassVar`` left out, an ``InitVar`` a parameter only, ``field(init=False)`` a field only,
        names after ``_: KW_ONLY`` keyword-only; a plain subclass inherits its bases' generated
        ``__init__``. ``None`` for any other class."""
        if cls in self._record_fields:  # read on every construction and NamedTuple subscript
            return self._record_fields[cls]
        chain = [k for k in reversed(self.mro(cls)) if isinstance(k, ClassInfo) and _is_record_class(k, self.mro(k))]
        if not chain:
            self._record_fields[cls] = None
            return None
        fields: dict[str, RecordField] = {}
        for klass in chain:
            keyword_only = False
            for stmt in klass.node.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                kind = _annotation_kind(stmt.annotation)
                if kind == "kw_only":
                    keyword_only = True
                elif kind != "classvar":
                    init = not _declared_without_init(stmt.value)
                    fields[stmt.target.id] = RecordField(stmt.target.id, init, kind != "initvar", keyword_only)
        self._record_fields[cls] = list(fields.values())
        return self._record_fields[cls]

    def construct_record(
        self: Analyzer, frame: Frame, cls: ClassInfo, record: list[RecordField], args: tuple[Value, ...],
        kwargs: tuple[tuple[str, Value], ...], node: ast.AST,
    ) -> dict[str, Value]:
        """The fields a dataclass or NamedTuple instance holds after construction: the arguments
        bound to the parameters of its generated ``__init__``, then what ``__post_init__`` (given the
        ``InitVar`` values) assigns on the instance."""
        params = [f for f in record if f.init]
        given = dict(zip((f.name for f in params if not f.keyword_only), args, strict=False))
        given.update((k, v) for k, v in kwargs if any(f.name == k for f in params))
        fields = {f.name: given[f.name] for f in params if f.stored and f.name in given}
        post_init = self.class_member(cls, "__post_init__")
        if post_init is not None and isinstance(post_init[0], Func):
            init_vars = tuple(given.get(f.name, OPAQUE) for f in params if not f.stored)
            receiver = Instance(cls, tuple(sorted(fields.items(), key=lambda kv: kv[0])))
            summary = self.invoke(frame, Func(post_init[0].info, receiver), init_vars, (), node)
            fields.update(summary.lazy_fields)
            fields.update(summary.self_writes)
        return fields

    def as_iterated(self: Analyzer, value: Value) -> Value:
        """``value`` as iterating over it sees it (``for part in meta``, ``list(meta)``, ``f(*meta)``):
        a ``typing.NamedTuple`` is the tuple of its fields; anything else is itself."""
        return self.record_items(value) or value

    def iterated(self: Analyzer, value: Value) -> Value:
        """What iterating over ``value`` gives, item by item."""
        return element_of(self.as_iterated(value))

    def record_items(self: Analyzer, value: Value) -> Seq | None:
        """A ``typing.NamedTuple`` instance as the tuple it is (``meta[1]``, ``a, b = meta``): its
        fields in order; else None."""
        if not isinstance(value, Instance) or not _is_named_tuple(self.mro(value.info)):
            return None
        record = self.record_fields(value.info) or []
        items = tuple(value.field(f.name) or OPAQUE for f in record if f.stored)
        return Seq(items, join(*items))

    def may_swallow(self: Analyzer, manager: Value) -> bool:
        """Whether a ``with`` on ``manager`` may swallow an exception of its body (so the block may
        end early and what follows still run): ``contextlib.suppress``, a ``@contextmanager``
        whose ``yield`` sits in a ``try`` with handlers, or a class whose ``__exit__`` may return a
        true value. Other external managers (``torch.no_grad()``, ``autocast``...) swallow nothing."""
        if isinstance(manager, Alt):
            return any(self.may_swallow(option) for option in manager.options)
        if isinstance(manager, External):
            return self.canonical(manager.dotted) in SWALLOWING_MANAGERS
        if isinstance(manager, GenCM):
            return _yield_in_handled_try(manager.func.info.node)
        if isinstance(manager, Instance):
            member = self.class_member(manager.info, "__exit__")
            if member is not None and isinstance(member[0], External):  # inherited: class Quiet(suppress)
                return self.canonical(member[0].dotted.rpartition(".")[0]) in SWALLOWING_MANAGERS
            return member is not None and isinstance(member[0], Func) and _may_return_true(member[0].info.node)
        return False

    def enter(self: Analyzer, frame: Frame, manager: Value, node: ast.AST) -> Value:
        """Enter a ``with`` context: apply what its ``__enter__`` (or ``@contextmanager`` body
        up to its ``yield``) publishes, and return the ``as`` value."""
        if hasattr(manager, "options"):
            base, results, states = frame.snapshot(), [], []
            for option in manager.options:  # type: ignore[attr-defined]
                frame.restore(base)
                results.append(self.enter(frame, option, node))
                states.append(frame.snapshot())
            frame.merge(states)
            return join(*results)
        if isinstance(manager, GenCM):
            summary = self.invoke(frame, manager.func, manager.args, manager.kwargs, node, enter=True)
            return summary.yield_value or OPAQUE
        if isinstance(manager, Instance):
            member = self.class_member(manager.info, "__enter__")
            if member is not None and isinstance(member[0], Func):
                bound = self.bind_member(frame, member[0], manager, node)
                if isinstance(bound, Func):
                    return self.invoke(frame, bound, (), (), node).ret
            return manager
        return OPAQUE


SWALLOWING_MANAGERS = frozenset({"contextlib.suppress", "contextlib.ExitStack", "contextlib.AsyncExitStack"})
"""External managers that may swallow their body's exception (an exit stack: any context entered on
it may)."""
_SWALLOWING_NAMES = frozenset(dotted.rpartition(".")[2] for dotted in SWALLOWING_MANAGERS)


def _yield_in_handled_try(func: ast.AST) -> bool:
    """A ``yield`` inside a ``try`` with handlers, or inside a ``with`` on a manager named like one
    that swallows (``suppress``, an ``ExitStack``): the generator's manager may swallow too."""
    def swallowing(node: ast.AST) -> bool:
        if isinstance(node, ast.Try | ast.TryStar):
            return bool(node.handlers)
        if isinstance(node, ast.With | ast.AsyncWith):
            named = (item.context_expr.func if isinstance(item.context_expr, ast.Call) else item.context_expr for item in node.items)
            return any(getattr(n, "attr", getattr(n, "id", "")) in _SWALLOWING_NAMES for n in named)
        return False

    return any(
        swallowing(node) and any(isinstance(inner, ast.Yield | ast.YieldFrom) for stmt in node.body for inner in ast.walk(stmt))
        for node in ast.walk(func)
    )


def _may_return_true(func: ast.AST) -> bool:
    """A ``return`` of anything but a literal ``None`` / ``False`` (a bare one returns ``None``)."""
    return any(
        isinstance(node, ast.Return) and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value in (None, False))
        for node in ast.walk(func)
    )


FORWARD_HOOKS = frozenset({
    "register_forward_pre_hook", "register_forward_hook",
    "register_module_forward_pre_hook", "register_module_forward_hook",
})
"""torch's hook registrations whose hook runs during a forward call."""


FORWARD_HOOK = "forward hook"
"""The sink of an unresolved event that stands for a registered forward hook."""
STORE = "store"
"""The sink of an unresolved event where the input is put into a container the checker cannot
read: a forward hook trial that only stores what it is given stays plain."""
_STORES = frozenset({"append", "insert", "extend", "add", "update", "setdefault", "__setitem__"})
"""Methods of a container the checker cannot read that put their argument into it."""


def is_code(value: Value) -> bool:
    """Whether ``value`` is analysed code an external callee could run (a function, a module...)."""
    if hasattr(value, "options"):
        return any(is_code(o) for o in value.options)  # type: ignore[attr-defined]
    return isinstance(value, Func | Instance | Partial | ClassRef | GenCM)


_NESTING = 3
"""How deep :meth:`CallMixin.current` updates the objects an object's fields hold."""
WRITING_FUNCTIONS = frozenset({"numpy.copyto", "numpy.put", "numpy.putmask", "numpy.place", "numpy.put_along_axis"})
"""numpy functions that write into the array given first."""
IN_PLACE_WRITES = frozenset({"copy_", "index_copy_", "scatter_", "index_put_", "masked_scatter_", "put_"})
"""Tensor methods that write what they are given into the tensor they are called on."""
_FILLS = frozenset({"append", "insert", "extend", "update", "setdefault"})
"""Container methods that put values into the container they are called on."""


def _filled(base: MapV | Seq, name: str, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...], node: ast.Call) -> MapV | Seq | None:
    """``base`` after ``base.<name>(*args, **kwargs)``, or None when ``name`` does not fill it."""
    if isinstance(base, Seq):
        if name in ("append", "insert") and args:
            return with_item(base, NO_KEY, args[-1])
        if name == "extend" and args:
            return Seq(None, join(element_of(base), element_of(args[0])), base.pipeline)
        return None
    if name == "update":
        filled: MapV = base
        for arg in args:
            filled = MapV(join(filled.values, arg.values if isinstance(arg, MapV) else element_of(arg)), None)
        for key, value in kwargs:
            filled = with_item(filled, key, value)  # type: ignore[assignment]
        return filled
    if name == "setdefault" and args:
        key = node.args[0].value if isinstance(node.args[0], ast.Constant) else NO_KEY
        return with_item(base, key, args[1] if len(args) > 1 else OPAQUE)
    return None


def _binds(target: ast.AST | None, name: str) -> bool:
    """Whether assigning to ``target`` rebinds the local ``name`` (``d[name] = v`` does not)."""
    return target is not None and any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(target)
    )


def _literal_items(expr: ast.expr, func: ast.AST) -> list[object] | None:
    """The constants a literal list or tuple holds — given directly, or through a local of
    ``func`` bound once, to such a literal, and never changed (``names = ["a", "b"]``)."""
    if isinstance(expr, ast.Name):
        bound = [
            site for site in ast.walk(func)
            if isinstance(site, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.For | ast.NamedExpr)
            and any(_binds(t, expr.id) for t in (site.targets if isinstance(site, ast.Assign) else [site.target]))
        ]  # fmt: skip
        mutated = any(
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == expr.id
            for call in ast.walk(func)
        )  # names.append(...) and kin
        if len(bound) != 1 or not isinstance(bound[0], ast.Assign) or mutated:
            return None
        expr = bound[0].value
    if isinstance(expr, ast.List | ast.Tuple) and all(isinstance(e, ast.Constant) for e in expr.elts):
        return [e.value for e in expr.elts]  # type: ignore[attr-defined]
    return None


GENERATOR_INPUTS = frozenset({"send", "throw"})
"""Generator methods that hand a value into the generator's body (not followed from there)."""


def _only_stores(trial: Iterable[Event]) -> bool:
    """Whether a forward hook's trial call reached nothing but stores of what it was given
    (transformers' output collector): no embedding, no host read, and no hand-off of the input or
    its tokens to code out of sight (``gc.get_referents(tokens)`` reaches the raw buffer)."""
    return all(e.kind == "unresolved" and e.sink == STORE for e in trial)


def _argument_given(func: Func, node: ast.AST, param: str) -> ast.expr | None:
    """The argument expression of call ``node`` that ``func``'s parameter ``param`` receives, where
    ``node`` is a plain call of ``func`` by its name (not through a partial, a runner or ``*args``)."""
    called = getattr(node.func, "attr", getattr(node.func, "id", None)) if isinstance(node, ast.Call) else None
    if not isinstance(node, ast.Call) or called is None or called != getattr(func.info.node, "name", None):
        return None
    keyword = next((kw.value for kw in node.keywords if kw.arg == param), None)
    if keyword is not None:
        return keyword
    spec = func.info.node.args
    names = [p.arg for p in [*spec.posonlyargs, *spec.args]][1 if func.bound is not None else 0 :]
    index = names.index(param) if param in names else -1
    if 0 <= index < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[: index + 1]):
        return node.args[index]
    return None


def hook_arguments(arity: int) -> tuple[Value, ...]:
    """What a forward hook is tried with: the module, the module call's arguments — which may hold
    the step's input (a pre-hook reading ``args[0].host_tokens`` reads it) — and its output."""
    return (OPAQUE, Seq(None, Input()), *(OPAQUE,) * (arity - 2))


def _filled_by_the_forward(hook: Func) -> Func:
    """``hook`` with the containers it closes over holding, besides what they hold now, the step's
    input and host tokens: the forward may put them there before torch runs the hook."""
    carried = join(Input(), Tokens("host"))

    def filled(value: Value) -> Value:
        if isinstance(value, MapV):
            return MapV(join(value.values, carried))
        if isinstance(value, Seq):
            return Seq(None, join(value.elem, *(value.items or ()), carried))
        return value

    return Func(hook.info, hook.bound, tuple((name, filled(v)) for name, v in hook.closure), hook.raw)


def code_reaches_tokens(code: Value, *, ids: bool = True) -> bool:
    """Whether analysed ``code`` can reach the step's ids without being handed them: through the
    enclosing locals it reads, the instance it is bound to, or a partial's arguments (``ids``: as
    for :func:`carries_tokens`)."""
    if hasattr(code, "options"):
        return any(code_reaches_tokens(o, ids=ids) for o in code.options)  # type: ignore[attr-defined]
    if isinstance(code, Func):
        return any(carries_tokens(v, ids=ids) for _, v in _free_values(code)) or (
            code.bound is not None and carries_tokens(code.bound, ids=ids)
        )
    if isinstance(code, Partial):
        return carries_tokens(code, ids=ids) or code_reaches_tokens(code.target, ids=ids)
    return carries_tokens(code, ids=ids)


def _free_values(func: Func) -> list[tuple[str, Value]]:
    """The enclosing locals ``func`` reads (its closure holds every local where it was defined)."""
    used = {n.id for n in ast.walk(func.info.node) if isinstance(n, ast.Name)}
    return [(name, value) for name, value in func.closure if name in used]


def _binds_otherwise(site: ast.AST, name: str, func: ast.AST) -> bool:
    """Whether ``site`` binds ``name`` in a way other than an assignment to a plain name."""
    if isinstance(site, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and site is not func:
        return site.name == name
    if isinstance(site, ast.alias):
        return (site.asname or site.name.partition(".")[0]) == name
    if isinstance(site, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        return site.name == name
    if isinstance(site, ast.MatchMapping):
        return site.rest == name
    if isinstance(site, ast.Global | ast.Nonlocal):
        return name in site.names
    return False


def _builds_its_own_class(new: ast.AST) -> bool:
    """Whether a ``__new__`` only ever builds the class it is given: every ``X.__new__(...)`` it
    calls (``super().__new__``, ``object.__new__``...) is given its own first parameter, never
    rebound — a singleton or a per-class cache keeps its class; vLLM's ``PluggableLayer``, which
    calls ``super().__new__(impl)`` with the class a registry names, does not."""
    if not isinstance(new, ast.FunctionDef) or not (params := [*new.args.posonlyargs, *new.args.args]):
        return False
    cls = params[0].arg
    if any(isinstance(n, ast.Name) and n.id == cls and isinstance(n.ctx, ast.Store) for n in ast.walk(new)):
        return False
    return all(
        bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == cls
        for call in ast.walk(new)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__new__"
    )


def _held_objects(held: Value) -> list[Instance]:
    """The analysed objects a field holds: itself, or the items of a ModuleList / ModuleDict."""
    options = getattr(held, "options", (held,))
    inner = [v for o in options for v in ((*(o.items or ()), o.elem) if isinstance(o, Seq) else (o.values,) if isinstance(o, MapV) else ())]
    return [v for o in (*options, *inner) for v in getattr(o, "options", (o,)) if isinstance(v, Instance)]


def _instances(value: Value) -> list[ClassInfo]:
    return [v.info for v in getattr(value, "options", (value,)) if isinstance(v, Instance)]


class RecordField(NamedTuple):
    """One parameter of a dataclass's or NamedTuple's generated ``__init__``."""

    name: str
    init: bool  # a parameter of __init__ (not ``field(init=False)``)
    stored: bool  # kept on the instance (not an ``InitVar``)
    keyword_only: bool  # after ``_: KW_ONLY``


def _is_named_tuple(mro: list[ClassInfo | External]) -> bool:
    return any(isinstance(k, External) and k.dotted.rpartition(".")[2] == "NamedTuple" for k in mro)


def _is_record_class(cls: ClassInfo, mro: list[ClassInfo | External]) -> bool:
    """Whether ``cls`` gets a generated ``__init__`` from its annotations: a dataclass (decorated
    itself) or a ``typing.NamedTuple`` subclass."""
    return "dataclass" in decorator_names(cls.node) or _is_named_tuple(mro)


def _annotation_kind(annotation: ast.expr) -> str:
    """``"classvar"``, ``"initvar"``, ``"kw_only"`` (the ``KW_ONLY`` sentinel) or ``"field"``."""
    head = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    if isinstance(head, ast.Constant) and isinstance(head.value, str):  # a string annotation
        head_name = head.value.partition("[")[0].rpartition(".")[2]
    else:
        head_name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
    return {"ClassVar": "classvar", "InitVar": "initvar", "KW_ONLY": "kw_only"}.get(head_name, "field")


def _declared_without_init(default: ast.expr | None) -> bool:
    """Whether a dataclass field's default is ``field(init=False)``."""
    return (
        isinstance(default, ast.Call)
        and (default.func.attr if isinstance(default.func, ast.Attribute) else getattr(default.func, "id", "")) == "field"
        and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in default.keywords)
    )
