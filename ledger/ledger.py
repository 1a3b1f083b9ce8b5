"""The ledger: one JSON record per spec item, written by the pytest plugin, read by ``tokenstate specs``.

File format (``.tokenstate/ledger.json``)::

    {"version": 1, "generated": "<UTC ISO time>", "spec_dirs": ["<folder>", ...], "root": "<rootdir>",
     "items": [{"id", "spec", "state", "test", "red_before_verified", "last_result", "mutant",
                "mutant_doc", "text", "spec_file", "spec_line", "nodeids", "timestamp"}, ...],
     "specs": [{"spec", "title", "file", "cross_check", "timestamp"}, ...]}

``spec_dirs`` are the folders the run took its specs from (pytest's ``tokenstate_specs``, relative to
``root``, the run's pytest rootdir, where possible). ``last_result`` is one of :data:`RESULTS` or ``null`` (never run); ``red_before_verified`` is
``true``/``false`` for a paid item whose test ran, ``null`` otherwise. A run updates the items whose
tests it ran and keeps the previous results of the others, so running a subset of the suite never
erases what a full run proved; items no longer listed in any spec are dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tokenstate.contracts.errors import ConfigError
from tokenstate.ledger.spec import ITEM_ID, Spec, SpecItem

__all__ = ["LEDGER_VERSION", "RESULTS", "Ledger", "LedgerEntry", "SpecCheckEntry", "worst_result"]

LEDGER_VERSION = 1
# Ordered from best to worst: when an item's test runs several times (parametrised), the worst wins.
RESULTS: tuple[str, ...] = (
    "passed",
    "xfailed",
    "skipped",
    "xpassed",
    "red-before-lost",
    "failed",
    "error",
)


def worst_result(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return max(a, b, key=RESULTS.index)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class LedgerEntry:
    id: str
    spec: str
    state: str  # "owed" | "paid"
    test: str  # as written in the spec, relative to the spec file
    text: str
    spec_file: str  # relative to the ledger's root where possible
    spec_line: int
    red_before_verified: bool | None = None
    last_result: str | None = None
    mutant: str | None = None
    mutant_doc: str | None = None
    nodeids: list[str] = field(default_factory=list)
    timestamp: str | None = None

    @classmethod
    def for_item(cls, item: SpecItem, root: Path) -> LedgerEntry:
        return cls(
            id=item.id,
            spec=item.spec,
            state=item.state,
            test=item.test,
            text=item.text,
            spec_file=_relative(item.spec_file, root),
            spec_line=item.line,
        )


@dataclass
class SpecCheckEntry:
    spec: str
    title: str
    file: str
    cross_check: str | None = None  # "passed" | "failed" | null (spec not collected yet)
    timestamp: str | None = None


@dataclass
class ItemOutcome:
    """What one run observed for one item (merged across parametrised cases and xdist workers)."""

    result: str | None = None
    red_before: bool | None = None
    mutant: str | None = None
    mutant_doc: str | None = None
    nodeids: list[str] = field(default_factory=list)

    def add(self, nodeid: str, result: str | None, red_before: bool | None) -> None:
        if nodeid not in self.nodeids:
            self.nodeids.append(nodeid)
        self.result = worst_result(self.result, result)
        if red_before is not None:
            self.red_before = (
                red_before if self.red_before is None else (self.red_before and red_before)
            )


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(path).as_posix()


@dataclass
class Ledger:
    items: list[LedgerEntry]
    specs: list[SpecCheckEntry]
    generated: str | None = None
    spec_dirs: list[str] = field(default_factory=list)
    error: str | None = None  # why the run could not read the specs (then there are no items)
    root: str | None = None  # pytest's rootdir for the run: the paths above are relative to it

    @classmethod
    def build(
        cls,
        specs: Iterable[Spec],
        root: Path,
        outcomes: Mapping[str, ItemOutcome],
        spec_checks: Mapping[str, str],
        previous: Ledger | None = None,
        spec_dirs: Iterable[Path] = (),
    ) -> Ledger:
        """Entries for every current spec item: this run's outcomes, else the previous results."""
        old_items = {e.id: e for e in previous.items} if previous else {}
        old_specs = {s.spec: s for s in previous.specs} if previous else {}
        stamp = now()
        items: list[LedgerEntry] = []
        checks: list[SpecCheckEntry] = []
        for spec in specs:
            check = SpecCheckEntry(spec.slug, spec.title, _relative(spec.path, root))
            if spec.slug in spec_checks:
                check.cross_check, check.timestamp = spec_checks[spec.slug], stamp
            elif spec.slug in old_specs:
                check.cross_check, check.timestamp = (
                    old_specs[spec.slug].cross_check,
                    old_specs[spec.slug].timestamp,
                )
            checks.append(check)
            for item in spec.items:
                entry = LedgerEntry.for_item(item, root)
                outcome = outcomes.get(item.id)
                old = old_items.get(item.id)
                if outcome is not None and outcome.result is not None:
                    entry.last_result, entry.timestamp = outcome.result, stamp
                    entry.red_before_verified = outcome.red_before if item.state == "paid" else None
                    entry.mutant, entry.mutant_doc = outcome.mutant, outcome.mutant_doc
                    entry.nodeids = list(outcome.nodeids)
                    unrun = [n for n in old.nodeids if n not in outcome.nodeids] if old is not None else []
                    if spec.slug not in spec_checks and unrun and old is not None and old.state == item.state:
                        # A subset run (-k, one node) ran only some of the item's cases: what the
                        # cases it left out last proved still counts, so it can only get worse.
                        entry.last_result = worst_result(entry.last_result, old.last_result)
                        if item.state == "paid" and old.red_before_verified is not None:
                            current = entry.red_before_verified
                            entry.red_before_verified = old.red_before_verified and current is not False
                        entry.nodeids = [*entry.nodeids, *unrun]
                elif old is not None and old.state == item.state and old.test == item.test:
                    # Not run this time: keep what the last run proved (its timestamp says when).
                    for name in (
                        "last_result",
                        "red_before_verified",
                        "mutant",
                        "mutant_doc",
                        "nodeids",
                        "timestamp",
                    ):
                        setattr(entry, name, getattr(old, name))
                items.append(entry)
        return cls(items, checks, stamp, [_relative(d, root) for d in spec_dirs], root=str(root))

    @classmethod
    def unreadable(cls, root: Path, spec_dirs: Iterable[Path], error: str) -> Ledger:
        """The ledger of a run that could not read its specs: no items, and why — what an earlier
        run proved no longer stands for specs that changed."""
        return cls([], [], now(), [_relative(d, root) for d in spec_dirs], error, str(root))

    def to_json(self) -> dict[str, Any]:
        return {
            "version": LEDGER_VERSION,
            "generated": self.generated,
            "spec_dirs": self.spec_dirs,
            "root": self.root,
            "error": self.error,
            "items": [asdict(e) for e in self.items],
            "specs": [asdict(s) for s in self.specs],
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "ledger") -> Ledger:
        if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
            raise ConfigError(
                f"{source}: not a version-{LEDGER_VERSION} tokenstate ledger; re-run pytest to rewrite it."
            )
        try:
            ledger = cls(
                [LedgerEntry(**_known(LedgerEntry, e)) for e in data.get("items", [])],
                [SpecCheckEntry(**_known(SpecCheckEntry, s)) for s in data.get("specs", [])],
                data.get("generated"),
                [str(d) for d in data.get("spec_dirs", [])],
                None if data.get("error") is None else str(data["error"]),
                data.get("root"),
            )
        except TypeError as exc:
            raise ConfigError(
                f"{source}: malformed ledger entry ({exc}); re-run pytest to rewrite it."
            ) from exc
        wrong = [
            f"{getattr(e, 'id', '?')}.{f.name}" for e in ledger.items for f in fields(LedgerEntry)
            if not _has_type(getattr(e, f.name), _ENTRY_TYPES[f.name])
        ] + [
            f"specs.{c.spec}.{f.name}" for c in ledger.specs for f in fields(SpecCheckEntry)
            if not _has_type(getattr(c, f.name), _CHECK_TYPES[f.name])
        ] + [
            name for name, value, types in (
                ("generated", data.get("generated"), (str, type(None))),
                ("error", data.get("error"), (str, type(None))),
                ("root", data.get("root"), (str, type(None))),
                ("spec_dirs", data.get("spec_dirs", []), (list,)),
            ) if not _has_type(value, types) or (name == "spec_dirs" and not all(isinstance(d, str) for d in value))
        ]  # fmt: skip
        if wrong:
            raise ConfigError(
                f"{source}: fields of the wrong type ({', '.join(wrong[:5])}); re-run pytest to rewrite it."
            )
        bad = [e.id for e in ledger.items if not ITEM_ID.fullmatch(e.id)]
        if bad:
            raise ConfigError(
                f"{source}: item ids {bad!r} are not spec item ids (like ABC-1); re-run pytest to rewrite it."
            )
        return ledger

    @classmethod
    def read(cls, path: Path) -> Ledger:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"no ledger at {path}: run the test suite (`pytest`) first; the tokenstate pytest plugin "
                "writes it (see --tokenstate-ledger)."
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}: not valid JSON ({exc}); re-run pytest to rewrite it."
            ) from exc
        return cls.from_json(data, str(path))

    def write(self, path: Path) -> None:
        """Write atomically, so a reader never sees half a ledger."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)


_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "spec": (str,), "state": (str,), "test": (str,), "text": (str,), "spec_file": (str,),
    "spec_line": (int,), "red_before_verified": (bool, type(None)), "last_result": (str, type(None)),
    "mutant": (str, type(None)), "mutant_doc": (str, type(None)), "nodeids": (list,),
    "timestamp": (str, type(None)),
}  # fmt: skip


_CHECK_TYPES: dict[str, tuple[type, ...]] = {
    "spec": (str,), "title": (str,), "file": (str,), "cross_check": (str, type(None)), "timestamp": (str, type(None)),
}  # fmt: skip


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    if int in types and isinstance(value, bool):
        return False  # JSON true is not a line number
    return isinstance(value, types)


def _known(cls: type, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}
