"""Abstract values of the routing analysis: what a Python expression may hold, as far as token ids go.

The analysis only needs to know (a) where token ids come from and (b) which code a call reaches, so
the lattice is small: plain data without token ids is :data:`OPAQUE`; token-id tensors are
:class:`Ids` carrying their origins; objects the analysis can follow (functions, classes, instances
of analysed classes, modules, partials, containers, scope cells) are their own values; anything it
could not resolve is :class:`Unknown`, with the reason. Alternatives join into :class:`Alt`.
Every value is immutable and hashable because it is part of the memo key of a function summary.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "OPAQUE",
    "RETURNS_SELF",
    "Alt",
    "Bound",
    "Cell",
    "ClassInfo",
    "ClassRef",
    "External",
    "Flag",
    "Func",
    "FuncInfo",
    "GenCM",
    "Ids",
    "Input",
    "Instance",
    "MapV",
    "ModuleRef",
    "Opaque",
    "Origin",
    "Partial",
    "Seq",
    "Super",
    "Tokens",
    "Unknown",
    "Value",
    "carries_tokens",
    "has_ids",
    "join",
    "taint",
]

# Reading these off a token-id tensor gives metadata, not ids (for host ids, the `.ids` read that
# produced the tensor is already a finding: it raises on a step with spliced rows).
METADATA_ATTRS = frozenset(
    {"shape", "dtype", "device", "size", "numel", "dim", "ndim", "is_cuda", "nelement", "stride",
     "element_size", "data_ptr", "is_contiguous", "requires_grad", "layout"}
)

NAMED_SETTERS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})
"""Methods of an analysed object that assign the attribute their first argument names (``nn.Module``'s
``register_buffer("last_ids", t)`` is ``self.last_ids = t``, ``add_module("embed", m)`` is
``self.embed = m``)."""
SUBMODULE_WALKS = frozenset({"modules", "named_modules", "children", "named_children"})
"""``nn.Module`` methods iterating over a module's submodules (a replacement pass walks them)."""
SUBMODULE_PATHS = frozenset({"get_submodule", "set_submodule"})
"""``nn.Module`` methods reaching a submodule by its dotted path (``"stack.source"``)."""
RECORD_METHODS = frozenset({"_asdict", "_replace"})
"""``typing.NamedTuple`` methods handing out or replacing its fields."""
# nn.Module methods that return the module itself: `Model(cfg).to(device)` is still a Model.
RETURNS_SELF = frozenset(
    "to cuda cpu xpu eval train float half double bfloat16 requires_grad_ share_memory to_empty "
    "apply type".split()
)


class Value:
    """Base of every abstract value."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Opaque(Value):
    """Data that holds no token ids (hidden states, positions, configs, None...)."""


OPAQUE = Opaque()


@dataclass(frozen=True, slots=True)
class NoneWithoutDeviceIds(Value):
    """``None`` exactly when the step has no device ids: the default of
    ``getattr(inp.device_tokens, "ids", None)``, so ``is None`` on it guards like
    ``inp.device_tokens is None``. Otherwise plain data."""


NONE_WITHOUT_DEVICE_IDS = NoneWithoutDeviceIds()


@dataclass(frozen=True, slots=True)
class Unknown(Value):
    """A value the analysis could not resolve; reaching a sink or a call with token ids, it is reported."""

    reason: str
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Origin:
    """Where token ids were read: ``kind`` is device | host | host_fresh | host_raw."""

    kind: str
    what: str
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Ids(Value):
    """A tensor derived from token ids read at ``origins``."""

    origins: frozenset[Origin]


@dataclass(frozen=True, slots=True)
class Input(Value):
    """The step's ``ForwardInput``."""


@dataclass(frozen=True, slots=True)
class Tokens(Value):
    """``inp.device_tokens`` (kind ``device``) or ``inp.host_tokens`` (kind ``host``).

    ``fresh``: host tokens taken where there are no device ids (under ``inp.device_tokens is
    None``, or as the fallback of ``inp.device_tokens or inp.host_tokens``): that holds for the
    whole forward call, so their ids are fresh wherever they are read later."""

    kind: str
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class FuncInfo:
    """A function (or lambda) in analysed source; identity is module + qualname + line."""

    module: str
    qualname: str
    line: int
    file: str = field(compare=False)
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda = field(compare=False, repr=False)
    owner: ClassInfo | None = field(default=None, compare=False, repr=False)

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True, slots=True)
class ClassInfo:
    """A class in analysed source."""

    module: str
    qualname: str
    line: int
    file: str = field(compare=False)
    node: ast.ClassDef = field(compare=False, repr=False)

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True, slots=True)
class Func(Value):
    """A function value; ``bound`` is its receiver for methods, ``closure`` the enclosing locals.

    ``raw``: the ``def``'s own body, before its analysed decorators apply — what a decorator
    receives; a call of a Func that is not raw goes through what its decorators return."""

    info: FuncInfo
    bound: Value | None = None
    closure: tuple[tuple[str, Value], ...] = ()
    raw: bool = False


@dataclass(frozen=True, slots=True)
class ClassRef(Value):
    info: ClassInfo


@dataclass(frozen=True, slots=True)
class Instance(Value):
    """An instance of an analysed class with the fields its constructor assigned."""

    info: ClassInfo
    fields: tuple[tuple[str, Value], ...] = ()

    def field(self, name: str) -> Value | None:
        for key, value in self.fields:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class ModuleRef(Value):
    """An analysed module (its globals are resolved from source)."""

    name: str


@dataclass(frozen=True, slots=True)
class External(Value):
    """Something from outside the analysed modules, by dotted name (``torch.nn.Embedding``)."""

    dotted: str
    instance: bool = False


@dataclass(frozen=True, slots=True)
class Bound(Value):
    """Attribute ``name`` of a value the analysis models itself (a tensor method, ``cell.set``...)."""

    base: Value
    name: str


@dataclass(frozen=True, slots=True)
class Partial(Value):
    target: Value
    args: tuple[Value, ...]
    kwargs: tuple[tuple[str, Value], ...]


@dataclass(frozen=True, slots=True)
class Seq(Value):
    """A list/tuple/ModuleList (``items`` when known) or ``nn.Sequential`` (``pipeline``)."""

    items: tuple[Value, ...] | None
    elem: Value
    pipeline: bool = False


@dataclass(frozen=True, slots=True)
class MapV(Value):
    """A dict/ModuleDict: a lookup gives any of its ``values``, unless its key is a constant found in
    ``items`` (the constant-keyed entries, known when every key of the dict is a constant)."""

    values: Value
    items: tuple[tuple[object, Value], ...] | None = None

    def lookup(self, key: object) -> Value:
        """The value under constant ``key`` (all values when the keys are not all known); the last
        entry under it wins, as in ``{"k": a, "k": b}`` and ``dict(d, k=b)``."""
        for known, value in reversed(self.items or ()):
            if known == key and type(known) is type(key):
                return value
        return self.values if self.items is None else OPAQUE  # every key known, this one absent


@dataclass(frozen=True, slots=True)
class Flag(Value):
    """A truth value that tells whether device ids are present (``inp.device_tokens is None``...).

    ``fresh_if_true`` / ``fresh_if_false``: on that side of a branch on this value, no row is
    spliced, so host ids are fresh. ``device_if_true`` / ``device_if_false``: on that side the step
    has device ids. It flows like any value, which is how a helper predicate
    (``def has_device_ids(inp): return inp.device_tokens is not None``) guards its caller's branch.
    """

    fresh_if_true: bool
    fresh_if_false: bool
    # on that side device ids are present (`inp.device_tokens is not None`, stale rows exist): a
    # side a caller with no device ids never takes
    device_if_true: bool = False
    device_if_false: bool = False

    def negated(self) -> Flag:
        return Flag(self.fresh_if_false, self.fresh_if_true, self.device_if_false, self.device_if_true)


@dataclass(frozen=True, slots=True)
class Cell(Value):
    """A scope store: a ContextVar, a threading.local, or a module-level stack list."""

    name: str
    kind: str  # cvar | local | stack


@dataclass(frozen=True, slots=True)
class GenCM(Value):
    """The context manager returned by a ``@contextmanager`` function, not yet entered."""

    func: Func
    args: tuple[Value, ...]
    kwargs: tuple[tuple[str, Value], ...]


@dataclass(frozen=True, slots=True)
class Super(Value):
    """``super()`` inside a method of ``info``, for ``receiver``."""

    info: ClassInfo
    receiver: Value


@dataclass(frozen=True, slots=True)
class Pending(Value):
    """A thread pool's future of a job the checker followed: ``.result()`` is what the job returned."""

    result: Value


@dataclass(frozen=True, slots=True)
class Alt(Value):
    """One of several values (branches, loop iterations, heterogeneous containers)."""

    options: frozenset[Value]


_DEVICE_TOKENS = Tokens("device")


def join(*values: Value | None) -> Value:
    """The least value covering all ``values``; plain data is dropped next to anything richer."""
    options: set[Value] = set()
    origins: set[Origin] = set()
    for value in values:
        if value is None:
            continue
        for option in value.options if isinstance(value, Alt) else (value,):
            if isinstance(option, Ids):
                origins |= option.origins
            else:
                options.add(option)
    if origins:
        options.add(Ids(frozenset(origins)))
    if len(options) > 1 and not any(isinstance(o, Flag) for o in options) and _DEVICE_TOKENS not in options:
        # Plain data next to a flag stays: `return False` beside a device-ids test is no guard. And
        # next to the device tokens: `inp.device_tokens if flag else None` is None with device ids
        # present, so `is None` on it is no guard either.
        options.discard(OPAQUE)
    if not options:
        return OPAQUE
    if len(options) == 1:
        return options.pop()
    return Alt(frozenset(options))


def taint(value: Value) -> Value:
    """What flows from ``value`` into a tensor computed from it: its token ids and its unknowns."""
    if isinstance(value, Ids | Unknown):
        return value
    if isinstance(value, Tokens):
        kind = "device" if value.kind == "device" else "host"
        return Ids(frozenset({Origin(kind, f"inp.{value.kind}_tokens", "", 0)}))
    if isinstance(value, Alt):
        return join(*(taint(v) for v in value.options))
    if isinstance(value, Seq):
        return join(*(taint(v) for v in value.items or ()), taint(value.elem))
    if isinstance(value, MapV):
        return taint(value.values)
    if isinstance(value, Pending):
        return taint(value.result)
    if isinstance(value, Bound) and value.name not in METADATA_ATTRS:
        return taint(value.base)
    return OPAQUE


def _with_origins(value: Value, kind_map: dict[str, str], tokens_fresh: bool | None) -> Value:
    if isinstance(value, Ids):
        return Ids(frozenset(dataclasses.replace(o, kind=kind_map.get(o.kind, o.kind)) for o in value.origins))
    if isinstance(value, Tokens) and value.kind == "host" and tokens_fresh is not None:
        return Tokens("host", tokens_fresh)
    if isinstance(value, Flag) and tokens_fresh is False:
        return OPAQUE  # whether this call had device ids says nothing about the next one's
    if isinstance(value, Alt):
        return join(*(_with_origins(v, kind_map, tokens_fresh) for v in value.options))
    if isinstance(value, Seq):
        items = None if value.items is None else tuple(_with_origins(v, kind_map, tokens_fresh) for v in value.items)
        return Seq(items, _with_origins(value.elem, kind_map, tokens_fresh), value.pipeline)
    if isinstance(value, MapV):
        items = None if value.items is None else tuple((k, _with_origins(v, kind_map, tokens_fresh)) for k, v in value.items)
        return MapV(_with_origins(value.values, kind_map, tokens_fresh), items)
    if isinstance(value, Pending):
        return Pending(_with_origins(value.result, kind_map, tokens_fresh))
    return value


def stored_beyond_the_call(value: Value) -> Value:
    """``value`` as a later forward call reads it back from the model (or another object or cell
    that outlives the call): host ids or tokens that were fresh in this call are not in the next."""
    return _with_origins(value, {"host_fresh": "host"}, tokens_fresh=False)


def without_kept_ids(value: Value) -> Value:
    """``value`` without the host ids an earlier forward call kept in it (``host_kept`` origins):
    what a fill in place leaves of a buffer's old content, the part it wrote being what is read
    (``staged[:n].copy_(ids)``, then ``staged[:n]``; the checker does not track which part)."""
    if isinstance(value, Ids):
        kept = frozenset(o for o in value.origins if o.kind != "host_kept")
        return Ids(kept) if kept else OPAQUE
    if isinstance(value, Alt):
        return join(*(without_kept_ids(o) for o in value.options))
    return value


def read_without_device_ids(value: Value) -> Value:
    """Ids used on a path of this call that has no device ids: their host origins are fresh here,
    whenever they were read (the read itself, outside a guard, is reported where it happened)."""
    return _with_origins(value, {"host": "host_fresh"}, tokens_fresh=None)


NO_KEY = object()
"""The key of an item write whose key is not a constant."""


def with_item(container: MapV | Seq, key: object, value: Value) -> MapV | Seq:
    """``container`` after ``container[key] = value`` (or ``append``, with ``NO_KEY``): the entry
    is replaced where the key is a constant the container's known items hold, else joined in."""
    if isinstance(container, MapV):
        if container.items is None or key is NO_KEY:
            return MapV(join(container.values, value), None)
        kept = tuple((k, v) for k, v in container.items if not (k == key and type(k) is type(key)))
        return MapV(join(container.values, value), (*kept, (key, value)))
    items = container.items
    if items is not None and type(key) is int and -len(items) <= key < len(items):
        replaced = list(items)
        replaced[key] = value
        return Seq(tuple(replaced), join(container.elem, value), container.pipeline)
    return Seq(None, join(*(items or ()), container.elem, value), container.pipeline)


def has_ids(value: Value) -> bool:
    """Whether token ids flow from ``value``."""
    flowing = taint(value)
    return isinstance(flowing, Ids) or (
        isinstance(flowing, Alt) and any(isinstance(v, Ids) for v in flowing.options)
    )


def with_writes(inst: Instance, writes: Mapping[str, Value]) -> Instance:
    """``inst`` with the attribute values ``writes`` joined into its fields (a write may or may not
    have happened on the path that reads it)."""
    if not writes:
        return inst
    fields = dict(inst.fields)
    for name, value in writes.items():
        fields[name] = join(fields.get(name), value)
    return Instance(inst.info, tuple(sorted(fields.items(), key=lambda kv: kv[0])))


def carries_tokens(value: Value, *, ids: bool = True) -> bool:
    """Whether ``value`` holds token ids or the objects that hand them out (``ids=False``: only
    those objects — the forward input and its tokens — not ids already read)."""
    if isinstance(value, Input | Tokens) or (ids and isinstance(value, Ids)):
        return True
    if isinstance(value, Alt):
        return any(carries_tokens(v, ids=ids) for v in value.options)
    if isinstance(value, Seq):
        return any(carries_tokens(v, ids=ids) for v in value.items or ()) or carries_tokens(value.elem, ids=ids)
    if isinstance(value, MapV):
        return carries_tokens(value.values, ids=ids)
    if isinstance(value, Pending):
        return carries_tokens(value.result, ids=ids)
    if isinstance(value, Instance):
        return any(carries_tokens(v, ids=ids) for _, v in value.fields)
    if isinstance(value, Partial):
        return any(carries_tokens(v, ids=ids) for v in value.args) or any(carries_tokens(v, ids=ids) for _, v in value.kwargs)
    return False
