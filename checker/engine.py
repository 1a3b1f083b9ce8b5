"""The routing checker's driver: entry points in, verdicts with routes out.

``check_entry_points`` analyses each registered forward from source (see the package docs for the
rules) and never executes the analysed code. Source that is missing or unparsable, and any failure
of the analysis itself, becomes a finding on the entry point concerned instead of a traceback.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence

from tokenstate.checker.calls import (
    FORWARD_HOOK,
    HOST_READ,
    RAW_READ,
    SPREAD,
    CallMixin,
    RecordField,
)
from tokenstate.checker.config import CheckerConfig, SinkSpec
from tokenstate.checker.evaluate import ExprMixin
from tokenstate.checker.execute import StmtMixin
from tokenstate.checker.externals import HIDDEN, ExternalMixin
from tokenstate.checker.frame import Event, Frame, Summary, default_cell
from tokenstate.checker.guards import GuardMixin
from tokenstate.checker.report import (
    CheckReport,
    EntryResult,
    EntryTarget,
    Route,
    Verdict,
)
from tokenstate.checker.resolve import Patch, ResolverMixin
from tokenstate.checker.sources import ModuleInfo, SourceError, SourceTable
from tokenstate.checker.values import (
    OPAQUE,
    Alt,
    ClassInfo,
    ClassRef,
    Func,
    Ids,
    Input,
    Instance,
    MapV,
    Seq,
    Unknown,
    Value,
    carries_tokens,
    join,
    stored_beyond_the_call,
    with_writes,
)

__all__ = ["Analyzer", "check_entry_points"]

_HOST_KINDS = {"host": "ignores", "host_raw": "ignores", "host_kept": "ignores", "host_fresh": "honors", "device": "honors"}
_ORDER = {"ignores": 0, "unknown": 1, "honors": 2}


class Analyzer(CallMixin, ExternalMixin, StmtMixin, ExprMixin, GuardMixin, ResolverMixin):
    """One checker run: shared parse tables, name resolution and function summaries."""

    def __init__(self, config: CheckerConfig) -> None:
        self.config = config
        self.sources = SourceTable(config.search_paths)
        self._resolver_init()
        self.memo: dict[tuple[object, ...], Summary] = {}
        self.in_progress: set[tuple[object, ...]] = set()
        self._generators: dict[ast.AST, bool] = {}
        self._wrappers: dict[ast.AST, str | None] = {}
        self._decorators: dict[ast.AST, tuple[tuple[str, Value], ...]] = {}
        self._class_patches: dict[ClassInfo, dict[str, str]] = {}
        self._patched_after_body: dict[ClassInfo, dict[str, list[Patch]]] = {}
        self._package_patches: dict[str, dict[ClassInfo, dict[str, list[Patch]]]] = {}
        self._sharing_attributes: dict[ClassInfo, dict[str, frozenset[str]]] = {}
        self._sharing_globals: dict[str, dict[str, frozenset[str]]] = {}
        self._decorating: set[ast.AST] = set()  # defs whose decorators are being applied
        self._record_fields: dict[ClassInfo, list[RecordField] | None] = {}
        self._early_returns: dict[ast.stmt, ast.If | None] = {}  # `if self._ready: return`, read as its `if not`
        # module globals some call wrote through the module object (state.K = v): their scope
        # cells, which a plain read of the name consults (a ContextVar's cell, of the same name,
        # holds the scope's value, not the variable)
        self.globals_written_through_modules: set[str] = set()
        self._reading_kept: set[ast.AST] = set()  # methods being analysed again with what they kept
        self.sink_functions: dict[str, SinkSpec] = {
            self.canonical(s.dotted): s for s in config.sinks if s.kind == "function"
        }
        self.sink_modules: dict[str, SinkSpec] = {
            self.canonical(s.dotted): s for s in config.sinks if s.kind == "module"
        }

    def analyse(self, func: Func, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...],
                published: dict[str, Value], fresh: bool, depth: int) -> Summary:
        info = func.info
        module = self.sources.module(info.module)
        as_of, self._as_of = self._as_of, {}  # a function runs after every module was imported
        try:
            return self._analyse(func, args, kwargs, published, fresh, depth, module)
        finally:
            self._as_of = as_of

    def _analyse(self, func: Func, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...],
                 published: dict[str, Value], fresh: bool, depth: int, module: ModuleInfo) -> Summary:
        info = func.info
        frame = Frame(info, module, self.config.display(info.file), {}, dict(published), fresh, depth)
        frame.closure = dict(func.closure)
        self.bind_arguments(frame, func, args, kwargs)
        yielded = False
        if isinstance(info.node, ast.Lambda):
            frame.returns.append(self.eval(frame, info.node.body))
        else:
            ended = self.exec_block(frame, info.node.body)
            yielded = self.is_generator(info.node)
            if frame.return_states:  # an early `return` keeps what was written on its way
                frame.join_exits(frame.return_states + ([] if ended else [frame.snapshot()]))
        kept = {name: ids for name, value in frame.self_writes.items() if (ids := _possibly_stale_ids(value)) != OPAQUE}
        if kept and isinstance(func.bound, Instance) and info.node not in self._reading_kept:
            # The next call of this method finds those ids on its receiver: one that reads them
            # before writing embeds an earlier step's ids on a stale step (RCK-76).
            self._reading_kept.add(info.node)
            try:
                later = self.analyse(dataclasses.replace(func, bound=with_writes(func.bound, kept)), args, kwargs, published, fresh, depth)
            finally:
                self._reading_kept.discard(info.node)
            for event in later.events:
                frame.add_event(event)
        ret = join(*frame.returns) if frame.returns else OPAQUE
        if yielded and "contextmanager" not in self.decorators(func):
            ret = Seq(None, frame.yield_value or OPAQUE)  # a generator: iterating gives what it yields
        # What it assigned on its receiver and other objects is handed to its caller as made: the
        # caller reads it in the same forward call. It goes stale on a path of a call that did not
        # write it (Frame.merge) and in the next forward call (analyse_entry's second pass).
        return Summary(
            ret,
            tuple(frame.events.values()),
            tuple(frame.writes.items()),
            tuple(frame.self_writes.items()),
            None if frame.yield_writes is None else tuple(frame.yield_writes.items()),
            frame.yield_value,
            tuple((info, tuple(writes.items())) for info, writes in frame.obj_writes.items()),
            tuple(frame.param_fills.items()),
            tuple(frame.lazy_fields.items()),
        )

    def is_generator(self, node: ast.AST) -> bool:
        found = self._generators.get(node)
        if found is None:
            found = any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node))
            self._generators[node] = found
        return found

    def bind_arguments(self, frame: Frame, func: Func, args: tuple[Value, ...], kwargs: tuple[tuple[str, Value], ...]) -> None:
        spec = func.info.node.args
        positional = [*spec.posonlyargs, *spec.args]
        values = ((func.bound,) if func.bound is not None else ()) + args
        env = frame.env
        for param, value in zip(positional, values, strict=False):
            env[param.arg] = value
        if spec.vararg is not None:
            env[spec.vararg.arg] = Seq(values[len(positional):], join(*values[len(positional):]))
        names = {p.arg for p in [*positional, *spec.kwonlyargs]}
        extra: list[tuple[str, Value]] = []
        spread = [value for key, value in kwargs if key == SPREAD]
        for key, value in kwargs:
            if key in names:
                env[key] = value
            elif key != SPREAD:
                extra.append((key, value))
        if spread:  # **mapping with unknown keys: any parameter not given otherwise may get any value
            for param in [*positional, *spec.kwonlyargs]:
                if param.arg not in env:
                    env[param.arg] = join(*spread)
        if spec.kwarg is not None:
            values = join(*(v for _, v in extra), *spread)
            env[spec.kwarg.arg] = MapV(values, None if spread else tuple(extra))
        module_frame = self.module_frame(frame.module)
        module_frame.closure = frame.closure
        defaults = dict(zip([p.arg for p in positional][len(positional) - len(spec.defaults):], spec.defaults, strict=False))
        defaults.update({p.arg: d for p, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=False) if d is not None})
        for param in [*positional, *spec.kwonlyargs]:
            if param.arg not in env:
                default = defaults.get(param.arg)
                env[param.arg] = OPAQUE if default is None else self.eval(module_frame, default)
                if default is not None and _builds_a_shared_default(default):  # one object for every call that omits it
                    cell = frame.default_cells[param.arg] = default_cell(func.info, param.arg)
                    env[param.arg] = frame.published.get(cell, env[param.arg])
        frame.params = frozenset(p.arg for p in [*positional, *spec.kwonlyargs])
        if func.info.owner is not None and positional and "staticmethod" not in self.decorators(func):
            frame.self_name = positional[0].arg
            frame.self_value = env.get(frame.self_name)

    # ---- entry points --------------------------------------------------------------------------

    def check(self, target: EntryTarget) -> EntryResult:
        result = EntryResult(target.name, f"{target.module}.{target.qualname}", target.module, 0,
                             target.declared, Verdict.UNKNOWN)
        try:
            module = self.sources.module(target.module)
            result.file = self.config.display(module.file)
            func = self.find_function(target)
            if isinstance(func, Unknown):
                result.error = f"cannot analyse: {func.reason}"
                return result
            result.line = func.info.line
            summary = self.analyse_entry(module, func, target)
        except SourceError as exc:
            result.error = f"cannot analyse: {self.config.display(exc.file)}: {exc.message}"
            return result
        except RecursionError:
            result.error = "cannot analyse: the source nests too deeply for the checker"
            return result
        except Exception as exc:  # a checker bug must not hide the other entry points' results
            result.error = f"internal checker error ({type(exc).__name__}: {exc}); please report it"
            return result
        routes = sorted(
            {r for event in summary.events for r in self.routes(event)},
            # embeddings before plain reads: the first route of a kind is the one to show
            key=lambda r: (_ORDER[r.kind], r.sink in (HOST_READ, RAW_READ), len(r.hops), r.hops, r.sink, r.source),
        )
        # One unresolved value flows into many later calls (every tensor method on a compiled
        # function's result): its first route says it all.
        shown: set[str] = set()
        result.routes = []
        for route in routes:
            if route.kind == "unknown":
                if route.source in shown:
                    continue
                shown.add(route.source)
            result.routes.append(route)
        kinds = {r.kind for r in result.routes}
        result.verdict = next(
            (v for k, v in (("ignores", Verdict.IGNORES), ("unknown", Verdict.UNKNOWN),
                            ("honors", Verdict.HONORS)) if k in kinds),
            Verdict.INERT,
        )
        return result

    def analyse_entry(self, module: ModuleInfo, func: Func, target: EntryTarget) -> Summary:
        """The registered forward's call: through what its analysed decorators return (the
        runtime's ``@entry_point`` wraps exactly that), with the model and the step's input; a
        forward hook the model's construction registered counts as part of every call."""
        construction = self.frame_at_the_def(func, module)
        args = self.entry_arguments(target, func, construction)
        hooks = tuple(e for e in construction.events.values() if e.sink == FORWARD_HOOK)
        summary = self.entry_call(func, module, args)
        # The next step: the objects this one kept on the model that hand out ids
        # (``self.previous = inp.host_tokens``, the whole input) are there when the forward runs
        # again, so a second call sees them. Ids kept are left out here: read in their own step
        # they are that step's real ids, whatever reads them later (a method that reads back host
        # ids it left unwritten on a path is analysed again with them: see ``analyse``).
        kept = {
            info: {
                name: _token_objects(stored_beyond_the_call(value))
                for name, value in writes if carries_tokens(value, ids=False)
            }
            for info, writes in summary.obj_writes
        }
        if any(kept.values()):
            later = self.entry_call(func, module, tuple(_with_kept_state(a, kept) for a in args))
            seen = set(summary.events)
            summary = dataclasses.replace(summary, events=(*summary.events, *(e for e in later.events if e not in seen)))
        return dataclasses.replace(summary, events=(*hooks, *summary.events))

    def frame_at_the_def(self, func: Func, module: ModuleInfo) -> Frame:
        """A fresh frame where the forward's def stands (the model is built, the decorators applied
        and what they return called there)."""
        return Frame(func.info, module, self.config.display(module.file), {}, {}, False, 0)

    def entry_call(self, func: Func, module: ModuleInfo, args: tuple[Value, ...]) -> Summary:
        """One call of the registered forward with ``args``, through what its analysed decorators
        return (the runtime's ``@entry_point`` wraps exactly that)."""
        frame, at = self.frame_at_the_def(func, module), ast.Pass(lineno=func.info.line)
        entry = self.decorated(frame, func, at)
        if entry == func:
            return self.analyse(func, args, (), {}, False, 0)
        self.call(frame, entry, args, (), at)
        return Summary(OPAQUE, tuple(frame.events.values()), (), (), None, None, tuple(
            (info, tuple(writes.items())) for info, writes in frame.obj_writes.items()
        ))

    def find_function(self, target: EntryTarget) -> Func | Unknown:
        head, *rest = target.qualname.split(".")
        value = self.resolve_global(target.module, head)
        frame = self.module_frame(self.sources.module(target.module))
        for part in rest:
            value = self.attribute(frame, value, part, ast.Pass())
        if isinstance(value, Func):
            return Func(value.info)
        return Unknown(f"no function {target.qualname} found in module {target.module}", target.module, 0)

    def entry_arguments(self, target: EntryTarget, func: Func, frame: Frame) -> tuple[Value, ...]:
        params = [*func.info.node.args.posonlyargs, *func.info.node.args.args]
        if len(params) < 2 and func.info.node.args.vararg is not None:
            # The runtime calls forward(model, inp): what the named parameters do not take, *args does.
            annotation = params[0].annotation if params else None
            return (self.model_value(frame, target, annotation), Input())
        inp_index = next(
            (i for i, p in enumerate(params) if p.arg == "inp" or _names_forward_input(p.annotation)),
            1,
        )
        args: list[Value] = []
        for index, param in enumerate(params):
            if index == inp_index:
                args.append(Input())
            elif index == 0:
                args.append(self.model_value(frame, target, param.annotation))
            else:
                args.append(OPAQUE)
        return tuple(args)

    def model_value(self, frame: Frame, target: EntryTarget, annotation: ast.expr | None) -> Value:
        """The model the forward receives: what the factory's build returns (the runtime passes
        exactly that, so a subclass built for an annotated base is analysed as the subclass), else
        an instance of the annotated class."""
        built = self.built_model(frame, target)
        if built is not None:
            return built
        if annotation is not None:
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                annotation = ast.parse(annotation.value, mode="eval").body
            classes = self.eval(frame, annotation)
            options = getattr(classes, "options", (classes,))
            if all(isinstance(o, ClassRef) for o in options):
                return join(*(self.instantiate(frame, o.info, (), (), annotation) for o in options))
        return Unknown(
            "the model's class is unknown: annotate the forward's model parameter with its class",
            frame.file, 0,
        )

    def built_model(self, frame: Frame, target: EntryTarget) -> Value | None:
        if not (target.model_module and target.model_qualname):
            return None
        build = self.resolve_global(target.model_module, target.model_qualname)
        if not isinstance(build, Func):
            return None
        built = self.invoke(frame, build, (), (), ast.Pass()).ret
        # What build assigned on the model after making it (``model.token_ids = MethodType(f,
        # model)``) is on the instance the forward gets (invoke recorded it in this frame).
        options = [self.current(frame, o) if isinstance(o, Instance) else o for o in getattr(built, "options", (built,))]
        if all(isinstance(o, Instance) for o in options):
            return join(*options)
        hidden = [o for o in options if isinstance(o, Unknown) and HIDDEN in o.reason]
        return hidden[0] if hidden else None  # torch.compile(model): the forward gets a wrapper

    def routes(self, event: Event) -> list[Route]:
        if event.kind == "unresolved":
            assert isinstance(event.ids, Unknown)
            return [Route("unknown", event.hops, "unresolved call", _describe_unknown(event.ids))]
        routes = []
        for part in getattr(event.ids, "options", (event.ids,)):
            if isinstance(part, Ids):
                for origin in part.origins:
                    where = f" ({origin.file}:{origin.line})" if origin.file else ""
                    fresh = {"host_fresh": " [no device ids on this path]",
                             "host_kept": " [kept by an earlier forward call]"}.get(origin.kind, "")
                    routes.append(Route(_HOST_KINDS[origin.kind], event.hops, event.sink, f"{origin.what}{where}{fresh}"))
            elif isinstance(part, Unknown):
                routes.append(Route("unknown", event.hops, event.sink, _describe_unknown(part)))
        return routes


def _possibly_stale_ids(value: Value) -> Value:
    """The host ids of ``value``, kept on the receiver at the end of a call, that a path of the
    call left unwritten (``if not stale: self.last = host ids``: possibly an earlier step's), as
    the next call finds them (``host_kept``; a fill in place of the buffer holding them covers them,
    see ``without_kept_ids``). Ids the call read fresh are left out: they are that step's real ids,
    whatever reads them later (a previous-token feature). ``OPAQUE`` if none."""
    if isinstance(value, Ids):
        stale = frozenset(dataclasses.replace(o, kind="host_kept") for o in value.origins if o.kind in ("host", "host_kept"))
        return Ids(stale) if stale else OPAQUE
    if isinstance(value, Alt):
        return join(*(_possibly_stale_ids(o) for o in value.options))
    return OPAQUE


def _token_objects(value: Value) -> Value:
    """``value`` without the ids it holds, keeping the objects that hand them out (tokens, inputs)."""
    if isinstance(value, Ids):
        return OPAQUE
    if isinstance(value, Alt):
        return join(*(_token_objects(o) for o in value.options))
    return value


def _with_kept_state(value: Value, kept: dict[ClassInfo, dict[str, Value]], depth: int = 0) -> Value:
    """``value`` with what a call assigned on instances of each class (``kept``) joined into the
    fields of those instances, down its sub-modules and containers."""
    if depth > 8:
        return value
    if isinstance(value, Instance):
        inner = Instance(value.info, tuple((name, _with_kept_state(v, kept, depth + 1)) for name, v in value.fields))
        return with_writes(inner, kept.get(value.info, {}))
    if isinstance(value, Seq):
        items = None if value.items is None else tuple(_with_kept_state(v, kept, depth + 1) for v in value.items)
        return Seq(items, _with_kept_state(value.elem, kept, depth + 1), value.pipeline)
    if isinstance(value, Alt):
        return join(*(_with_kept_state(o, kept, depth + 1) for o in value.options))
    return value


def _names_forward_input(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    return text.rpartition(".")[2].strip("'\"") == "ForwardInput"


def _describe_unknown(value: Unknown) -> str:
    where = f" ({value.file}:{value.line})" if value.line else f" ({value.file})"
    return f"unresolved: {value.reason}{where}"


def check_entry_points(targets: Sequence[EntryTarget], config: CheckerConfig | None = None) -> CheckReport:
    """Analyse each target's forward from source and classify it (see :class:`Verdict`).

    The packages of the targets (and of their build functions) are analysed in addition to
    ``config.roots``. Nothing is imported or executed.
    """
    config = config or CheckerConfig()
    roots = {t.module.partition(".")[0] for t in targets}
    roots |= {t.model_module.partition(".")[0] for t in targets if t.model_module}
    analyzer = Analyzer(config.with_roots(roots))
    return CheckReport([analyzer.check(target) for target in targets])


def _builds_a_shared_default(default: ast.expr) -> bool:
    """Whether a parameter default builds an object (``[]``, ``{}``, ``torch.zeros(n)``, any call):
    evaluated once, at the def, so every call that does not pass the argument shares that one
    object, and what one call writes into it the next one reads."""
    return isinstance(default, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp | ast.Call)
