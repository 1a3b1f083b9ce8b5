"""The state of one function analysis (a frame) and the summary it leaves for its callers."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenstate.checker.report import Hop
from tokenstate.checker.sources import ModuleInfo
from tokenstate.checker.values import ClassInfo, FuncInfo, Value, join, stored_beyond_the_call

__all__ = ["Event", "Frame", "Summary"]


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
    events: dict[tuple[str, Hop, Value, str], Event] = field(default_factory=dict)
    writes: dict[str, Value] = field(default_factory=dict)
    self_writes: dict[str, Value] = field(default_factory=dict)
    returns: list[Value] = field(default_factory=list)
    raised: list[Value] = field(default_factory=list)  # what its ``raise`` statements raised, in order
    yield_writes: dict[str, Value] | None = None
    yield_value: Value | None = None
    # flow-insensitive: attributes assigned on other instances, joined per class (sound, coarser)
    obj_writes: dict[ClassInfo, dict[str, Value]] = field(default_factory=dict)
    self_aliases: set[Value] = field(default_factory=set)  # the receiver, updated with self_writes
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

    def write_cell(self, cell: str, value: Value) -> None:
        self.published[cell] = value
        self.writes[cell] = value

    def snapshot(self) -> tuple[dict[str, Value], dict[str, Value], dict[str, Value], dict[str, Value]]:
        return dict(self.env), dict(self.published), dict(self.writes), dict(self.self_writes)

    def restore(self, state: tuple[dict[str, Value], ...]) -> None:
        self.env, self.published, self.writes, self.self_writes = (dict(part) for part in state)

    def merge(self, states: list[tuple[dict[str, Value], ...]]) -> None:
        """Make the frame the join of several branch states (variables may hold any branch's value)."""
        if not states:
            return
        merged = []
        for index in range(4):
            parts = [state[index] for state in states]
            keys = dict.fromkeys(k for part in parts for k in part)
            merged.append({k: join(*(part.get(k) for part in parts)) for k in keys})
        for name, value in merged[3].items():
            if any(name not in part[3] for part in states):
                # a path that did not assign the receiver's attribute reads what an earlier call
                # left there: what is fresh in this call is not in that one
                merged[3][name] = join(value, stored_beyond_the_call(value))
        self.env, self.published, self.writes, self.self_writes = merged
