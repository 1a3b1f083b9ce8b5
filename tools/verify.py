"""``tokenstate verify``: routing checker → token gate → spec ledger, one verdict.

1. The routing checker over every registered forward (findings: ignores / unknown / a verdict that
   contradicts the declared opt-in).
2. The token gate for every registered model: sync vs async, and both vs the HF oracle when
   transformers is installed, on a built-in request set that forces chunked prefill and mixed
   prefill/decode steps.
3. The spec ledger: ``pytest --tokenstate-spec-tests`` runs in a subprocess from the current
   directory (or ``--specs DIR``), so pytest finds the project's configuration and spec folders as
   it would for a plain run; every spec document and the tests its items name run, every paid
   item's red-before is re-proved now, and the ledger they write is summarised.

Exit status 0 when all three are clean; 1 on any finding, divergence, failing item or lost
red-before; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tokenstate.contracts import ConfigError
from tokenstate.ledger.ledger import Ledger
from tokenstate.ledger.report import DEFAULT_LEDGER, is_healthy
from tokenstate.runtime.cli_support import factory_of_model
from tokenstate.tools.gate_cli import (
    add_model_arguments,
    gate_config,
    gate_models,
    render_gate,
    run_gates,
)
from tokenstate.tools.routing_check import check_registry

__all__ = ["SpecSummary", "add_verify_arguments", "run_spec_tests", "run_verify"]


@dataclass
class SpecSummary:
    """What the spec run showed (``ran=False`` with ``note`` when it did not run; a run that broke
    before writing its ledger is also ``unhealthy``, so verify fails)."""

    ran: bool
    note: str = ""
    paid: int = 0
    owed: int = 0
    verified: int = 0
    unhealthy: list[str] = field(default_factory=list)  # "ID: state/result/red-before"
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.unhealthy

    def to_json(self) -> dict[str, Any]:
        return {
            "ran": self.ran, "note": self.note, "paid": self.paid, "owed": self.owed,
            "red_before_verified": self.verified, "unhealthy": self.unhealthy,
            "passed": self.passed, "seconds": round(self.seconds, 1),
        }


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--specs", type=Path, default=None, metavar="DIR",
        help="a folder of the project whose spec ledger to re-prove: pytest runs there and finds the "
        "spec folders its configuration names, tokenstate_specs (default: the current directory)",
    )
    parser.add_argument("--no-specs", action="store_true", help="skip the spec ledger step")


def _spec_run_command(ledger_file: Path) -> list[str]:
    # No test paths: pytest finds the rootdir and configuration from the folder it runs in. The
    # ledger option in its = form: pytest finds its rootdir before plugin options are parsed.
    return [sys.executable, "-m", "pytest", "--tokenstate-spec-tests", "-q", "-p", "no:cacheprovider",
            "-p", "no:randomly", f"--tokenstate-ledger={ledger_file}"]


def run_spec_tests(root: Path, *, required: bool = False) -> SpecSummary:
    """Re-prove the spec ledger of the project ``root`` lies in: ``pytest --tokenstate-spec-tests``
    run there (a subprocess: the plugin needs a fresh session), so pytest finds the rootdir, the
    configuration and its ``tokenstate_specs`` folders as a plain ``pytest`` run from ``root``
    would, and runs every spec document with the tests its items name, wherever they live.

    A project without spec documents is "not run" — a failure when ``required`` (``--specs DIR``)."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        return SpecSummary(False, "pytest is not installed: pip install 'tokenstate[verify]'")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tokenstate-verify-") as tmp:
        ledger_file = Path(tmp) / "ledger.json"
        proc = subprocess.run(_spec_run_command(ledger_file), cwd=root, capture_output=True, text=True, env=dict(os.environ))
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        if not ledger_file.is_file():  # the run broke before its first result: a failure, not a skip
            note = f"the spec run failed: it wrote no ledger (pytest exit {proc.returncode}): {tail}"
            return SpecSummary(False, note, unhealthy=[note])
        ledger = Ledger.read(ledger_file)
    kept = _keep_in_the_project(ledger)
    folders = ", ".join(ledger.spec_dirs) or "(none)"
    if ledger.error is not None:
        note = f"the specs in {folders} cannot be read: {ledger.error}"
        return SpecSummary(False, note, unhealthy=[note])
    if not ledger.specs:
        note = (f"no spec documents in {folders} (pytest's tokenstate_specs, from {root}); name your "
                "spec folders with that ini option")
        return SpecSummary(False, note, unhealthy=[note] if required else [])
    summary = SpecSummary(True, f"specs in {folders} (pytest run from {root}){kept}", seconds=time.perf_counter() - start)
    for entry in ledger.items:
        summary.paid += entry.state == "paid"
        summary.owed += entry.state == "owed"
        summary.verified += entry.state == "paid" and entry.red_before_verified is True
        if not is_healthy(entry):
            red = {True: "verified", False: "LOST", None: "—"}[entry.red_before_verified]
            summary.unhealthy.append(f"{entry.id}: {entry.state}, last result {entry.last_result}, red-before {red}")
    for check in ledger.specs:
        if check.cross_check != "passed":
            summary.unhealthy.append(f"spec {check.spec}: cross-check {check.cross_check or 'not run'}")
    if proc.returncode not in (0, 1):
        summary.unhealthy.append(f"pytest exited {proc.returncode}: {tail}")
    return summary


def _keep_in_the_project(ledger: Ledger) -> str:
    """Write the run's ledger where a plain ``pytest`` run writes it (``<rootdir>/.tokenstate/``), so
    ``tokenstate specs`` shows what verify just proved; a project without spec documents gets none.
    Returns a note for the summary (empty when written)."""
    if not ledger.specs or ledger.root is None:
        return ""
    target = Path(ledger.root) / DEFAULT_LEDGER
    try:
        ledger.write(target)
    except OSError as exc:
        return f"; its ledger could not be kept in {target.parent} ({exc.strerror or exc})"
    return ""


def _render_checker(report: Any, console: Console) -> None:
    table = Table(title="routing checker", title_justify="left")
    longest = max((len(r.entry) for r in report.results), default=11)
    table.add_column("entry point", no_wrap=True, min_width=longest)
    for column in ("declared", "verdict", "finding"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        declared = {True: "honors", False: "does not honor", None: "—"}[r.declared]
        finding = f"[red]{escape(r.finding)}[/]" if r.finding else "[green]none[/]"
        table.add_row(escape(r.entry), declared, r.verdict.value, finding)
    console.print(table)
    for r in report.findings:
        for route in r.routes:
            text = route.render() if hasattr(route, "render") else str(route)
            console.print(f"  {escape(r.entry)}: {escape(text)}", highlight=False)


def _specs_root(args: argparse.Namespace) -> Path | None:
    """Where the spec step's pytest will run, checked before anything else runs (``None``: not run)."""
    if args.no_specs:
        return None
    if args.specs is None:
        return Path.cwd()
    root = Path(args.specs)
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "no such directory"
        raise ConfigError(f"--specs {root}: {what}; pass a folder of the project whose specs to re-prove.")
    return root.resolve()


def run_verify(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    specs_root = _specs_root(args)
    config = gate_config(args)  # a bad setting is refused before the checker runs, not after it
    models = gate_models(args)  # imports --module packages so their factories register
    # The checker covers what the gate covers: the named models, or every registered one.
    selected = [factory_of_model(m) for m in models] if args.model or args.module else None
    with console.status("routing checker", spinner="dots") if not args.json else contextlib.nullcontext():
        checker = check_registry((), selected=None if selected is None else list(dict.fromkeys(selected)))
    if not args.json:
        _render_checker(checker, console)
    gates = run_gates(models, config, console, quiet=args.json)
    if not args.json:
        render_gate(gates, console)
    specs = _spec_step(args, specs_root, console)
    passed = not checker.findings and all(g.passed for g in gates) and specs.passed
    if args.json:
        print(json.dumps({
            "passed": passed,
            "checker": json.loads(checker.to_json()),
            "gate": [g.to_json() for g in gates],
            "specs": specs.to_json(),
        }, indent=2))
    else:
        _render_specs(specs, console)
        verdict = "[bold green]verify: PASS[/]" if passed else "[bold red]verify: FAIL[/]"
        console.print(
            f"{verdict} — {len(checker.results)} entry point(s), {len(checker.findings)} finding(s); "
            f"{sum(g.passed for g in gates)}/{len(gates)} model(s) through the gate; "
            + (f"specs {specs.paid} paid ({specs.verified} red-before verified), {specs.owed} owed"
               if specs.ran else f"specs not run ({specs.note})")
        )
    return 0 if passed else 1


def _spec_step(args: argparse.Namespace, root: Path | None, console: Console) -> SpecSummary:
    if args.no_specs:
        return SpecSummary(False, "skipped (--no-specs)")
    assert root is not None  # _specs_root gives a folder unless --no-specs
    with console.status("re-proving the spec ledger (pytest --tokenstate-spec-tests)", spinner="dots") if not args.json else contextlib.nullcontext():
        return run_spec_tests(root, required=args.specs is not None)


def _render_specs(specs: SpecSummary, console: Console) -> None:
    if not specs.ran:
        console.print(f"spec ledger: not run — {escape(specs.note)}")
        return
    console.print(
        f"spec ledger: {specs.paid} paid ({specs.verified} red-before verified), {specs.owed} owed "
        f"[{specs.seconds:.0f} s]"
    )
    for line in specs.unhealthy:
        console.print(f"  [red]{escape(line)}[/]", highlight=False)
