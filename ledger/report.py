"""``tokenstate specs [--json]``: the spec ledger as a table or as JSON.

The ledger is the file the pytest plugin wrote: ``.tokenstate/ledger.json`` at pytest's rootdir, found
as the nearest one at or above the current directory (so ``tokenstate specs`` works from anywhere
inside the project, as ``pytest`` does), or ``--ledger PATH``. Exit status: 0 when every paid item passed and was re-proved
red under its mutant and every owed item is still an expected failure; 1 when any item is in
another state (failing, red-before lost, never run, ...), a spec's cross-check failed, or the ledger
proves nothing (it lists no item, or the run could not read the specs); 2 when there is no readable
ledger.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tokenstate.contracts.errors import ConfigError
from tokenstate.ledger.ledger import Ledger, LedgerEntry

__all__ = [
    "DEFAULT_LEDGER",
    "add_arguments",
    "find_ledger",
    "is_healthy",
    "ledger_table",
    "main_specs",
    "run_specs",
]

DEFAULT_LEDGER = Path(".tokenstate") / "ledger.json"


def find_ledger(start: Path) -> Path:
    """The ledger pytest wrote for the project ``start`` lies in: the nearest
    ``.tokenstate/ledger.json`` at or above ``start`` (pytest writes it at its rootdir, an ancestor
    of wherever it was run from). Raises ConfigError, saying where it looked, when there is none."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / DEFAULT_LEDGER).is_file():
            return folder / DEFAULT_LEDGER
    raise ConfigError(
        f"no ledger: no {DEFAULT_LEDGER} in {start} or any folder above it. The tokenstate pytest "
        "plugin writes it at pytest's rootdir after a run that meets spec documents (in the folders "
        "the tokenstate_specs ini option names; default specs/); run `pytest` (or `pytest "
        "--tokenstate-spec-tests`) where they are, or pass --ledger PATH."
    )


def is_healthy(entry: LedgerEntry) -> bool:
    """An owed item still fails as expected; a paid item passes and was re-proved red-before."""
    if entry.state == "owed":
        return entry.last_result == "xfailed"
    return entry.last_result == "passed" and entry.red_before_verified is True


def _red_before(entry: LedgerEntry) -> str:
    if entry.state == "owed" or entry.red_before_verified is None:
        return "—"
    return "verified" if entry.red_before_verified else "LOST"


def _numeric_order(entry: LedgerEntry) -> tuple[str, str, int]:
    prefix, _, number = entry.id.rpartition("-")
    return entry.spec, prefix, int(number)


def ledger_table(ledger: Ledger, spec: str | None = None) -> Table:
    table = Table(title="tokenstate spec ledger", title_justify="left")
    for column in ("id", "spec", "state", "last result", "red-before", "mutant", "test"):
        # a narrow terminal (80 columns, or no terminal) folds long names onto more lines: a slug,
        # mutant or test name cut to "tiny-mod…" names nothing to look up
        table.add_column(column, no_wrap=column in ("id", "state", "red-before"), overflow="fold")
    for entry in sorted(ledger.items, key=_numeric_order):
        if spec is not None and entry.spec != spec:
            continue
        table.add_row(
            entry.id,
            entry.spec,
            entry.state,
            entry.last_result or "not run",
            _red_before(entry),
            (entry.mutant or "—").partition("/")[2] or "—",
            entry.test.rpartition("::")[2],
            style=None if is_healthy(entry) else "red",
        )
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``specs`` subcommand's options (for the ``tokenstate`` CLI's subparser)."""
    parser.add_argument(
        "--json", action="store_true", help="print the ledger as JSON instead of a table"
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        default=None,
        help=f"the ledger file the pytest plugin wrote (default: the nearest {DEFAULT_LEDGER} at or "
        "above the current directory)",
    )
    parser.add_argument("--spec", default=None, help="show only the items of this spec (its slug)")


def run_specs(args: argparse.Namespace, console: Console | None = None) -> int:
    """Print the ledger; raises ConfigError (exit 2 via the CLI) when it cannot be read."""
    path = args.ledger if args.ledger is not None else find_ledger(Path.cwd())
    ledger = Ledger.read(path)
    if ledger.items and args.spec is not None and all(e.spec != args.spec for e in ledger.items):
        known = ", ".join(sorted({e.spec for e in ledger.items})) or "(none)"
        raise ConfigError(f"no spec {args.spec!r} in {path}; specs in the ledger: {known}.")
    items = [e for e in ledger.items if args.spec is None or e.spec == args.spec]
    failed_checks = [c.spec for c in ledger.specs if c.cross_check == "failed" and args.spec in (None, c.spec)]
    if args.json:
        data = ledger.to_json()
        data["items"] = [i for i in data["items"] if args.spec is None or i["spec"] == args.spec]
        print(json.dumps(data, indent=2))
    elif ledger.items:
        console = console or Console()
        console.print(ledger_table(ledger, args.spec))
        paid = [e for e in items if e.state == "paid"]
        verified = sum(1 for e in paid if e.red_before_verified)
        console.print(
            f"{len(paid)} paid ({verified} red-before verified), {len(items) - len(paid)} owed; "
            f"ledger {path}, written {ledger.generated}."
        )
    problems = []
    if ledger.error is not None:
        problems.append(f"the run that wrote it could not read the specs:\n{ledger.error}")
    elif not ledger.items:
        problems.append(f"it lists no spec items (spec folders: {', '.join(ledger.spec_dirs) or 'none recorded'})")
    if failed_checks:
        problems.append(
            f"the cross-check of {', '.join(failed_checks)} failed (its items and tests disagree; "
            "run pytest to see why)"
        )
    for problem in problems:
        print(f"tokenstate specs: {path}: {'nothing is proven' if not ledger.items else 'not healthy'} — {problem}", file=sys.stderr)
    return 0 if not problems and all(is_healthy(e) for e in items) else 1


def main_specs(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry: ``main_specs(["--json"])``; a missing or malformed ledger returns 2."""
    parser = argparse.ArgumentParser(prog="tokenstate specs", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_specs(args)
    except ConfigError as exc:
        print(f"tokenstate specs: error: {exc}", file=sys.stderr)
        return 2
