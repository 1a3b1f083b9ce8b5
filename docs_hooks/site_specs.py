"""Spec pages rendered from ``specs/*.md`` and the ledger JSON, at build time.

The spec documents decide which items exist and whether each is owed or paid (parsed by
``tokenstate.ledger``, the same parser the pytest plugin uses); the ledger adds what the
last test run proved. An item the ledger has never seen — a fresh clone, a docs build before the
tests, an item added since the last run — shows "not run yet": the docs build never runs the test
suite itself (the suite builds the docs, and a build that ran pytest would recurse).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

from tokenstate.ledger import Ledger, LedgerEntry, Spec, SpecItem, load_specs

__all__ = [
    "ItemStatus",
    "LedgerSource",
    "item_statuses",
    "read_ledger",
    "render_spec_index",
    "render_spec_page",
]

NOT_RUN = "not run yet"

# What a last result means for an item in each state (owed tests are strict expected failures).
_RESULT_TEXT = {
    ("paid", "passed"): "passed",
    ("paid", "failed"): "FAILED",
    ("paid", "error"): "ERROR",
    ("paid", "skipped"): "skipped",
    ("paid", "red-before-lost"): "FAILED: passes under its mutant",
    ("owed", "xfailed"): "fails as expected (still owed)",
    ("owed", "xpassed"): "PASSES: move it to Paid",
    ("owed", "skipped"): "skipped",
    ("owed", "failed"): "FAILED",
    ("owed", "error"): "ERROR",
}
_GOOD = {("paid", "passed"), ("owed", "xfailed")}


@dataclass(frozen=True)
class LedgerSource:
    """The ledger read for this build, or why there is none."""

    ledger: Ledger | None
    path: Path
    problem: str | None = None  # set when a ledger file exists but could not be read


def read_ledger(path: Path) -> LedgerSource:
    """Read the ledger if there is one; an unreadable ledger is reported on the pages, not fatal."""
    if not path.is_file():
        return LedgerSource(None, path)
    from tokenstate.contracts.errors import ConfigError

    try:
        return LedgerSource(Ledger.read(path), path)
    except ConfigError as exc:
        return LedgerSource(None, path, str(exc))


@dataclass(frozen=True)
class ItemStatus:
    item: SpecItem
    entry: LedgerEntry | None  # None: the ledger holds no run of this item as the spec states it

    @property
    def result_text(self) -> str:
        if self.entry is None or self.entry.last_result is None:
            return NOT_RUN
        return _RESULT_TEXT.get((self.item.state, self.entry.last_result), self.entry.last_result)

    @property
    def result_good(self) -> bool | None:
        if self.entry is None or self.entry.last_result is None:
            return None
        return (self.item.state, self.entry.last_result) in _GOOD

    @property
    def red_before_text(self) -> str:
        if self.item.state == "owed":
            return "—"
        if self.entry is None or self.entry.last_result is None:
            return NOT_RUN
        if self.entry.red_before_verified is None:
            return "not proved"  # the test ran but never reached its mutant re-run
        return "yes" if self.entry.red_before_verified else "NO"


_INLINE = MarkdownIt("commonmark")


def item_statuses(spec: Spec, ledger: Ledger | None) -> list[ItemStatus]:
    """Each item of the spec, in spec order, with its ledger entry when the ledger matches the spec."""
    entries = {e.id: e for e in ledger.items} if ledger else {}
    statuses = []
    for item in spec.items:
        entry = entries.get(item.id)
        # A ledger written before the spec moved the item or rebound its test says nothing about it now.
        if entry is not None and (entry.state != item.state or entry.test != item.test):
            entry = None
        statuses.append(ItemStatus(item, entry))
    return statuses


def _cell(text: str) -> str:
    """Escape text for a markdown table cell rendered as HTML."""
    return html.escape(text).replace("|", "&#124;")


def _md_cell(text: str) -> str:
    """The spec's own prose (code spans included) as HTML for one table cell.

    Rendered here rather than left to Python-Markdown: inside the ``markdown="1"`` wrapper its code
    spans escape quotes twice (``&amp;quot;`` shows up on the page).
    """
    return _INLINE.renderInline(text).replace("|", "&#124;")


def _breakable(text: str) -> str:
    """Escaped text that may wrap after ``_``, ``/`` and ``.`` only — between words, never inside one."""
    return re.sub(r"([_/.])", r"\1<wbr>", _cell(text))


def _test_cell(item: SpecItem) -> str:
    """The test's name, and below it the file (relative to the spec); both wrap between words."""
    file, _, name = item.test.partition("::")
    return f'<code>{_breakable(name)}</code><br><small title="{_cell(item.test)}">{_breakable(file)}</small>'


def _badge(kind: str, text: str) -> str:
    return f'<span class="ts-badge ts-{kind}">{_cell(text)}</span>'


def _state_badge(state: str) -> str:
    return _badge(state, state)


def _result_badge(status: ItemStatus) -> str:
    good = status.result_good
    kind = "none" if good is None else ("good" if good else "bad")
    return _badge(kind, status.result_text)


def _red_before_badge(status: ItemStatus) -> str:
    text = status.red_before_text
    kind = {"yes": "good", "NO": "bad"}.get(text, "none")
    return _badge(kind, text)


def _ledger_line(source: LedgerSource) -> str:
    if source.problem:
        return f'!!! failure "The ledger could not be read"\n    {_cell(source.problem)}\n'
    if source.ledger is None:
        return (
            '!!! info "No test run recorded yet"\n'
            "    No ledger was found, so every result reads *not run yet*. Run the test suite "
            "(`python -m pytest`) — the tokenstate pytest plugin writes `.tokenstate/ledger.json` — "
            "and rebuild the site.\n"
        )
    return f"Results from the ledger written {source.ledger.generated} (UTC).\n"


def _counts(statuses: Sequence[ItemStatus]) -> tuple[int, int, int]:
    paid = [s for s in statuses if s.item.state == "paid"]
    verified = sum(1 for s in paid if s.red_before_text == "yes")
    return len(paid), len(statuses) - len(paid), verified


def render_spec_page(spec: Spec, source: LedgerSource, repo_root: Path) -> str:
    """The markdown of one spec's page: contract, ledger table, mutants."""
    statuses = item_statuses(spec, source.ledger)
    paid, owed, verified = _counts(statuses)
    spec_file = spec.path.relative_to(repo_root).as_posix()
    out = [
        "---",
        "hide:",
        "  - toc",  # the ledger table needs the width
        "---",
        "",
        f"# {spec.title}",
        "",
        f"Source: `{spec_file}` · {paid} paid (red-before verified: {verified}) · {owed} owed",
        "",
        _ledger_line(source),
        "## Contract",
        "",
        spec.contract,
        "",
        "## Ledger",
        "",
        '<div class="ts-ledger" markdown="1">',
        "",
        "| Item | State | Promise | Test | Red-before verified | Last result |",
        "|---|---|---|---|---|---|",
    ]
    for s in statuses:
        out.append(
            f'| <span class="ts-item" id="{s.item.id}">{s.item.id}</span> | {_state_badge(s.item.state)} '
            f"| {_md_cell(s.item.text)} | {_test_cell(s.item)} | {_red_before_badge(s)} | {_result_badge(s)} |"
        )
    out += ["", "</div>"]
    mutants = [s for s in statuses if s.entry is not None and s.entry.mutant]
    if mutants:
        out += [
            "",
            "## Red-before mutants",
            "",
            "Each paid test is re-run with its mutant applied and must fail:",
            "",
        ]
        for s in mutants:
            assert s.entry is not None and s.entry.mutant is not None
            doc = f": {s.entry.mutant_doc}" if s.entry.mutant_doc else ""
            out.append(f"- **{s.item.id}** — `{s.entry.mutant}`{doc}")
    stamped = [s.entry.timestamp for s in statuses if s.entry is not None and s.entry.timestamp]
    if stamped:
        out += [
            "",
            f"Latest result recorded {max(stamped)} (UTC); items keep their last result until re-run.",
        ]
    return "\n".join(out) + "\n"


def render_spec_index(specs: Sequence[Spec], source: LedgerSource, page_of: dict[str, str]) -> str:
    """The Specs landing page: one row per spec with its counts."""
    out = [
        "# Specs",
        "",
        "Every promise about stale host token ids is a spec item with a stable id, listed as *owed* "
        "(promised, a strict expected failure until delivered) or *paid* (delivered: its test passes "
        "and fails again under its recorded red-before mutant). These pages are generated at build "
        "time from `specs/*.md` and the test ledger, so they cannot disagree with either.",
        "",
        _ledger_line(source),
    ]
    if not specs:
        out.append("No spec documents exist in `specs/` yet.")
        return "\n".join(out) + "\n"
    out += [
        "| Spec | Items | Paid | Red-before verified | Owed | Last results |",
        "|---|---|---|---|---|---|",
    ]
    for spec in specs:
        statuses = item_statuses(spec, source.ledger)
        paid, owed, verified = _counts(statuses)
        good = sum(1 for s in statuses if s.result_good)
        run = sum(1 for s in statuses if s.result_good is not None)
        results = f"{good}/{run} as expected" if run else NOT_RUN
        out.append(
            f"| [{_md_cell(spec.title)}]({page_of[spec.slug]}) | {len(statuses)} | {paid} | {verified} | {owed} "
            f"| {results} |"
        )
    return "\n".join(out) + "\n"


def load_repo_specs(repo_root: Path) -> list[Spec]:
    specs_dir = repo_root / "specs"
    return load_specs([specs_dir]) if specs_dir.is_dir() else []
