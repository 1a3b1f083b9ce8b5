"""Mutants of the adoption spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

import sys

from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "ADO-1/engine-unlocked",
    doc="LLM.generate, add_request, step and has_unfinished_requests run without the engine's lock, "
    "so a second thread's generate sees the first one's requests in flight and is refused.",
)
def engine_unlocked(patch: MutantPatch) -> None:
    from tokenstate.runtime.llm import LLM

    for name in ("generate", "add_request", "step", "has_unfinished_requests"):
        patch.setattr(LLM, name, getattr(LLM, name).__wrapped__)


@mutant(
    "ADO-2/checks-mode-read-late",
    doc="The command line does not read TOKENSTATE_CHECKS before running a command: the gate "
    "records the refusal as a model failure and check never reads it.",
)
def checks_mode_read_late(patch: MutantPatch) -> None:
    import tokenstate.tools.cli as cli

    patch.setattr(cli, "get_checks_mode", lambda: "boundary")


@mutant(
    "ADO-3/cwd-not-importable",
    doc="--module imports with sys.path as the console script has it, without the current directory.",
)
def cwd_not_importable(patch: MutantPatch) -> None:
    import importlib

    import tokenstate.runtime.cli_support as support

    def import_only(names: list[str]) -> None:
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                from tokenstate.contracts import ConfigError

                raise ConfigError(f"--module {name}: cannot import it ({exc}).") from exc

    patch.setattr(support, "import_modules", import_only)
    for module in ("tokenstate.tools.routing_check", "tokenstate.tools.gate_cli"):
        patch.setattr(sys.modules[module], "import_modules", import_only)


@mutant(
    "ADO-4/divergence-not-a-failure",
    doc="The gate assertion fails only on a contract error a path raised, not on tokens that differ.",
)
def divergence_not_a_failure(patch: MutantPatch) -> None:
    from tokenstate.tools.gate import GateReport

    patch.setattr(GateReport, "passed", property(lambda self: not self.errors))


@mutant(
    "ADO-6/ledger-in-cwd-only",
    doc="tokenstate specs reads .tokenstate/ledger.json in the current directory only, so from a "
    "subdirectory of the project it finds no ledger.",
)
def ledger_in_cwd_only(patch: MutantPatch) -> None:
    import tokenstate.ledger.report as report

    patch.setattr(report, "find_ledger", lambda start: report.DEFAULT_LEDGER)


@mutant(
    "ADO-5/verify-runs-pytest-specs",
    doc="verify runs `pytest specs` in the project folder: spec folders named by tokenstate_specs, and "
    "tests living outside them, are never run.",
)
def verify_runs_pytest_specs(patch: MutantPatch) -> None:
    import tokenstate.tools.verify as verify

    def old_command(ledger_file):  # type: ignore[no-untyped-def]
        return [sys.executable, "-m", "pytest", "specs", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                f"--tokenstate-ledger={ledger_file}"]

    patch.setattr(verify, "_spec_run_command", old_command)
