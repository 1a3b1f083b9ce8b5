"""The state of one function analysis (a frame) and the summary it leaves for its callers."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from tokenstate.checker.report import Hop
from tokenstate.checker.sources import ModuleInfo
from tokenstate.checker.values import ClassInfo, FuncInfo, Value, join, stored_beyond_the_call

__all__ = ["Event", "Frame", "State", "Summary", "buffer_cell", "class_cell", "module_cell"]


@dataclass(frozen=True)
class Event:
    """Something a route reached: an embedding (``sink``) or a call it could not resolve.

    ``ids`` is the abstract value of the embedded ids (for ``unresolved``: the unresolved callee);
    ``hops`` runs from the function that reported it down to the sink's own line.
    """

    kind: str  # sink | unresolved
    ids: Value
    sink: str
    hops: tuple[Hop, ...]

    @property
    def key(self) -> tuple[str, Hop, Value, str]:
        # the sink too: a host read embedded on its own line is two routes (the read, the embedding)
        return (self.kind, self.hops[-1], self.ids, self.sink)


@dataclass(frozen=True)
class Summary:
    """What a call to one function (in one abstract context) does, as seen by its caller."""

    ret: Value
    events: tuple[Event, ...]
    writes: tuple[tuple[str, Value], ...]  # scope cells the call left published
    self_writes: tuple[tuple[str, Value], ...]  # attributes assigned on its receiver
    yield_writes: tuple[tuple[str, Value], ...] | None  # cells published at its first ``yield``
    yield_value: Value | None
    # attributes assigned on instances other than the receiver, by class (``model.ids = ...``)
    obj_writes: tuple[tuple[ClassInfo, tuple[tuple[str, Value], ...]], ...] = ()
    # what it filled in place into the objects its parameters name, by parameter name
    param_fills: tuple[tuple[str, Value], ...] = ()
    # attributes it created lazily on its receiver (Frame.lazy_fields)
    lazy_fields: tuple[tuple[str, Value], ...] = ()


@dataclass
class Frame:
    """One function (or module-level expression) being analysed."""

    func: FuncInfo | None
    module: ModuleInfo
    file: str  # display path
    env: dict[str, Value]
    published: dict[str, Value]
    fresh: bool  # on this path device ids are known to be absent (host ids are fresh)
    depth: int
    narrow: dict[str, Value] = field(default_factory=dict)  # expression path -> narrowed value
    self_name: str | None = None
    self_value: Value | None = None
    closure: dict[str, Value] = field(default_factory=dict)
    globals_declared: set[str] = field(default_factory=set)
    nonlocals_declared: set[str] = field(default_factory=set)
    # parameters bound to their mutable default (`_seen=[]`), by the scope cell that object is: one
    # list for every call, filled in one and read in the next
    default_cells: dict[str, str] = field(default_factory=dict)
    events: dict[tuple[str, Hop, Value, str], Event] = field(default_factory=dict)
    writes: dict[str, Value] = field(default_factory=dict)
    self_writes: dict[str, Value] = field(default_factory=dict)
    returns: list[Value] = field(default_factory=list)
    return_states: list[State] = field(default_factory=list)  # the state at each `return`
    raised: list[Value] = field(default_factory=list)  # what its ``raise`` statements raised, in order
    yield_writes: dict[str, Value] | None = None
    yield_value: Value | None = None
    # attributes assigned on other instances, joined per class (sound, coarser), as made in this call
    obj_writes: dict[ClassInfo, dict[str, Value]] = field(default_factory=dict)
    self_aliases: set[Value] = field(default_factory=set)  # the receiver, updated with self_writes
    # attributes this call created on its receiver under a not-yet-set test (`if not hasattr(self,
    # "staged"):`, `if self.staged is None:`): the receiver holds them as created, not as written by
    # this call, since every later call skips the creation and finds what earlier calls left
    lazy_fields: dict[str, Value] = field(default_factory=dict)
    # local names bound to an attribute or another name (`buf = model.input_ids`): filling one in
    # place fills what it names
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    # a name bound to the name a walk gives a submodule (`for name, child in module.named_children()`)
    # -> the name bound to that submodule: `setattr(module, name, w)` replaces the one `child` is
    partners: dict[str, str] = field(default_factory=dict)
    params: frozenset[str] = frozenset()  # the function's parameter names
    # what this call filled in place into the objects its parameters name (`dst[:n].copy_(src)`)
    param_fills: dict[str, Value] = field(default_factory=dict)
    # per enclosing loop, innermost last: the states at its `break` / `continue` statements
    loop_exits: list[list[tuple[dict[str, Value], ...]]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.func.dotted if self.func is not None else self.module.name

    def hop(self, line: int) -> Hop:
        return Hop(self.name, self.file, line)

    def add_event(self, event: Event) -> None:
        if self.func is not None:  # module-level evaluation runs at import time, not in a forward
            self.events.setdefault(event.key, event)

    def record_writes(self, info: ClassInfo, writes: tuple[tuple[str, Value], ...] | dict[str, Value]) -> None:
        pairs = writes.items() if isinstance(writes, dict) else writes
        if not pairs:
            return
        known = self.obj_writes.setdefault(info, {})
        for name, value in pairs:
            known[name] = join(known.get(name), value)

    @property
    def fills(self) -> bool:
        """Whether a module-level object was filled in place on this path (a cheap test before the
        lookups of :meth:`filled`)."""
        return any(cell.endswith(_FILLED) for cell in self.published)

    def filled(self, variable: str | None) -> Value | None:
        """What module-level ``variable`` (``module.NAME``) was filled with in place, if anything."""
        return None if variable is None else self.published.get(buffer_cell(variable))

    def write_cell(self, cell: str, value: Value) -> None:
        self.published[cell] = value
        self.writes[cell] = value

    def snapshot(self) -> State:
        return (dict(self.env), dict(self.published), dict(self.writes), dict(self.self_writes),
                {info: dict(writes) for info, writes in self.obj_writes.items()})

    def restore(self, state: State) -> None:
        self.env, self.published, self.writes, self.self_writes = (dict(part) for part in state[:4])
        self.obj_writes = {info: dict(writes) for info, writes in state[4].items()}

    def join_exits(self, states: list[State]) -> None:
        """Make what the call leaves behind — cells, its receiver's and other objects' attributes —
        what any of its exits (``return`` statements, the end of its body) left: each written value
        joined, as a write on one exit is the caller's to read."""
        for index in (1, 2, 3):
            joined: dict[str, Value] = {}
            for state in states:
                for name, value in state[index].items():
                    joined[name] = join(joined.get(name), value)
            (self.published, self.writes, self.self_writes)[index - 1].update(joined)
        for state in states:
            for info, writes in state[4].items():
                self.record_writes(info, writes)

    def merge(self, states: list[State]) -> None:
        """Make the frame the join of several branch states (variables may hold any branch's value).

        What outlives the call — a scope cell (a module global, a class attribute, a buffer filled
        in place), an attribute of the receiver or of another object — holds, on a path that did
        not write it, what it held before: what a caller published, or else what an earlier call
        left there, where what is fresh in this call is not."""
        if not states:
            return
        merged = []
        for index in range(4):
            parts = [state[index] for state in states]
            keys = dict.fromkeys(k for part in parts for k in part)
            merged.append({k: join(*(part.get(k) for part in parts)) for k in keys})
        for index in (1, 2, 3):
            for name, value in merged[index].items():
                for state in states:
                    if name not in state[index]:
                        before = state[1].get(name) if index == 2 else None
                        earlier = before if before is not None else stored_beyond_the_call(value)
                        merged[index][name] = join(merged[index][name], earlier)
        objects: dict[ClassInfo, dict[str, Value]] = {}
        for info in dict.fromkeys(info for state in states for info in state[4]):
            names = dict.fromkeys(name for state in states for name in state[4].get(info, {}))
            objects[info] = {}
            for name in names:
                values = [state[4].get(info, {}).get(name) for state in states]
                value = join(*values)
                objects[info][name] = value if None not in values else join(value, stored_beyond_the_call(value))
        self.env, self.published, self.writes, self.self_writes = merged
        self.obj_writes = objects


State = tuple[dict[str, Value], dict[str, Value], dict[str, Value], dict[str, Value], dict[ClassInfo, dict[str, Value]]]
"""A frame's flow-sensitive state at one point: its locals, the cells published and written, and
the attributes written on its receiver and on other objects."""


def module_cell(frame: Frame, name: str) -> str:
    """The scope cell of module-level variable ``name`` of ``frame``'s module."""
    return f"{frame.module.name}.{name}"


def closure_cell(frame: Frame, name: str) -> str | None:
    """The scope cell of variable ``name`` of the function enclosing ``frame``'s (a closure's
    ``nonlocal name``): one cell for every closure of the enclosing call's scope, kept across calls
    of those closures. ``None`` outside a nested function."""
    if frame.func is None or ".<locals>." not in frame.func.qualname:
        return None
    return f"{frame.module.name}.{frame.func.qualname.rpartition('.<locals>.')[0]}.<locals>.{name}"


def default_cell(func: FuncInfo, param: str) -> str:
    """The scope cell of the mutable default of ``func``'s parameter ``param`` (``def f(x, seen=[])``)."""
    return f"{func.dotted}.<default>.{param}"


RESULT_CACHES = frozenset({"lru_cache", "cache"})
"""functools decorators that hand a later call what an earlier one returned."""


def cached_cell(func: FuncInfo) -> str:
    """The scope cell of what was written into the results of ``func``, an ``lru_cache`` /
    ``functools.cache`` function: a later call may be handed the same object."""
    return f"{func.dotted}.<cached>"


def class_cell(info: ClassInfo, name: str) -> str:
    """The scope cell of class attribute ``name`` of ``info``."""
    return f"{info.dotted}.{name}"


def buffer_cell(variable: str) -> str:
    """The scope cell of what module-level variable ``variable`` (``module.NAME``) was filled with
    in place (the name itself may also name a scope, as a module-level ``ContextVar`` does)."""
    return f"{variable}{_FILLED}"


_FILLED = "[...]"
