"""``tokenstate gate``: the async-vs-sync (and vs HF oracle) token gate, per model and request."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tokenstate.contracts import CHECK_MODES, ConfigError
from tokenstate.runtime.cli_support import factories_in, import_modules
from tokenstate.runtime.outputs import RequestOutput
from tokenstate.runtime.progress import observe_steps
from tokenstate.tools.gate import GateConfig, GateReport, run_gate
from tokenstate.tools.gate_matrix import CellReport

__all__ = ["add_model_arguments", "gate_config", "gate_models", "render_gate", "run_gate_command"]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``gate`` and ``verify``: which models, how many requests, where to run."""
    parser.add_argument(
        "--model", action="append", default=[], metavar="NAME",
        help="a preset (tiny-llama), an architecture, or an HF-format directory; repeatable "
        "(default: the first preset of every model the --module packages define, else of every "
        "registered model)",
    )
    parser.add_argument(
        "--module", action="append", default=[], metavar="PKG",
        help="import PKG (the current directory is importable) and gate only the models it "
        "defines; repeatable",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per model (default: 8)")
    parser.add_argument(
        "--max-tokens", type=int, default=None,
        help="tokens per request (default: 32, or as many as fit beside a chunked prompt in a "
        "shorter context)",
    )
    parser.add_argument(
        "--budget", type=int, default=32,
        help="token budget per step; prompts longer than it are prefilled in chunks (default: 32)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests running at once (default: 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the built-in request set (default: 0)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="execution device")
    parser.add_argument(
        "--checks", default=None, choices=CHECK_MODES,
        help="checks mode for the run (default: TOKENSTATE_CHECKS, else boundary)",
    )
    parser.add_argument("--no-oracle", action="store_true", help="skip the HF transformers oracle")
    parser.add_argument(
        "--quick", action="store_true",
        help="run the baseline schedule only, not the schedule matrix (random order, preemption, "
        "chunked prefill and budget skips, early stops, penalties and bad words, n-gram drafts)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


DEFAULT_MAX_TOKENS = 32


def gate_config(args: argparse.Namespace) -> GateConfig:
    return GateConfig(
        num_requests=args.requests,
        max_tokens=DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
        fit_max_tokens=args.max_tokens is None,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.budget,
        seed=args.seed,
        device=args.device,
        checks=args.checks,
        oracle=not args.no_oracle,
        quick=args.quick,
    )


def gate_models(args: argparse.Namespace) -> list[str]:
    """Import ``--module`` packages, then the models to gate.

    ``--model`` names them explicitly; otherwise the first preset of every model the ``--module``
    packages define, or of every registered model when no ``--module`` is given.
    """
    import_modules(args.module)
    if args.model:
        return list(args.model)
    models = []
    for factory in factories_in(args.module):
        if not factory.presets:
            raise ConfigError(
                f"registered model {factory.name!r} has no embedded preset to gate; pass --model with "
                "a path to its HF-format directory."
            )
        models.append(next(iter(factory.presets)))
    return models


def run_gates(models: list[str], config: GateConfig, console: Console, quiet: bool) -> list[GateReport]:
    """Gate every model, with a progress bar over the tokens the sync and async paths generate."""
    reports = []
    columns = (*Progress.get_default_columns(), MofNCompleteColumn(), TextColumn("tokens"))
    with Progress(*columns, console=console, transient=True, disable=quiet or not console.is_terminal) as progress:
        # Each request generates max_tokens on each of the two paths (the gate ignores EOS).
        per_model = 2 * config.num_requests * config.max_tokens
        task = progress.add_task("token gate", total=per_model * len(models))

        def advance(finished: Sequence[RequestOutput]) -> None:
            progress.advance(task, sum(len(out.token_ids) for out in finished))

        with observe_steps(advance):
            for i, name in enumerate(models):
                progress.update(task, description=f"token gate: {name}", completed=i * per_model)
                reports.append(run_gate(name, config))
        progress.update(task, completed=per_model * len(models))
    return reports


def _cell(report: GateReport, comparison: str) -> str:
    if comparison not in report.comparisons:
        return "—"
    matched, total = report.totals()[comparison]
    return f"[{'green' if matched == total else 'red'}]{matched}/{total}[/]"


def render_gate(reports: list[GateReport], console: Console) -> None:
    """A summary table per model, then every failing request with its first divergence."""
    table = Table(title="token gate (matched/total tokens)", title_justify="left")
    # Model names never wrap or shrink (CI logs are 80 columns wide); the numeric columns give way.
    table.add_column("model", no_wrap=True, min_width=max((len(r.model) for r in reports), default=5))
    for column in ("async vs sync", "sync vs oracle", "async vs oracle", "async steps", "fallback steps", "result"):
        table.add_column(column, overflow="fold")
    for r in reports:
        stats = r.stats.get("async", {})
        table.add_row(
            escape(r.model),
            *(_cell(r, c) for c in ("async vs sync", "sync vs oracle", "async vs oracle")),
            str(stats.get("async_steps", "—")),
            str(stats.get("fallback_steps", "—")),
            "[green]pass[/]" if r.passed else "[red]FAIL[/]",
        )
    console.print(table)
    for r in reports:
        if r.oracle_note:
            console.print(f"[yellow]oracle not run for {escape(r.model)}:[/] {escape(r.oracle_note)}; --no-oracle skips it", highlight=False)
    if any(r.cells for r in reports):
        _render_cells(reports, console)
    for r in reports:
        for problem in r.problems():
            console.print(f"[red]{escape(r.model)}[/] {escape(problem)}", highlight=False)


def _cell_tokens(cell: CellReport) -> str:
    parts = []
    for comparison, (matched, total) in cell.totals().items():
        colour = "green" if matched == total else "red"
        parts.append(f"{comparison.replace(' vs ', '/')} [{colour}]{matched}/{total}[/]")
    return ", ".join(parts) or "—"


def _render_cells(reports: list[GateReport], console: Console) -> None:
    """The schedule matrix: per model and cell, the tokens matched and the conditions reached."""
    table = Table(title="schedule matrix (each cell proves its condition was reached)", title_justify="left")
    table.add_column("model", no_wrap=True, min_width=max((len(r.model) for r in reports), default=5))
    for column in ("cell", "tokens matched", "conditions reached", "result"):
        table.add_column(column, overflow="fold")
    for r in reports:
        model = escape(r.model)
        for cell in r.cells:
            if cell.skipped:
                table.add_row(model, escape(cell.name), "—", escape(cell.skipped), "[yellow]skipped[/]")
                continue
            conditions = ", ".join(
                f"[{'green' if c.reached else 'red'}]{escape(c.describe())}[/]" for c in cell.conditions
            ) or ("—" if not cell.errors else "[red]raised[/]")
            table.add_row(
                model, escape(cell.name), _cell_tokens(cell), conditions,
                "[green]pass[/]" if cell.passed else "[red]FAIL[/]",
            )
    console.print(table)
    # Model names, errors and divergences are text: a shape like [num_logits, vocab] is not markup.
    for r in reports:
        for cell in r.cells:
            where = escape(f"{r.model}, cell {cell.name!r}")
            for path, error in cell.errors.items():
                console.print(f"[red]{where}, {path} path raised[/] {escape(error)}", highlight=False)
            for c in cell.conditions:
                if not c.reached:
                    console.print(
                        f"[red]{where}: condition not reached[/] — {escape(c.describe())}, needed {c.needed}",
                        highlight=False,
                    )
            for i, row in enumerate(cell.requests):
                for comparison, result in row.items():
                    if result.divergence is not None:
                        console.print(
                            f"[red]{escape(r.model)}[/] {escape(f'cell {cell.name!r}')} request {i}, "
                            f"{comparison}: {result.matched}/{result.total}; first divergence "
                            f"{escape(result.divergence.describe())}",
                            highlight=False,
                        )


def run_gate_command(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    reports = run_gates(gate_models(args), gate_config(args), console, quiet=args.json)
    if args.json:
        print(json.dumps({"passed": all(r.passed for r in reports), "models": [r.to_json() for r in reports]}, indent=2))
    else:
        render_gate(reports, console)
    return 0 if all(r.passed for r in reports) else 1
