"""The ``tokenstate`` command line.

Every subcommand lives in its own module, which provides an ``add_arguments``-style function and a
``run(args) -> int`` handler; this module only lists them. Errors become one clear line plus a hint
(``--debug`` shows the traceback), never an internal traceback by default.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from tokenstate.contracts import TokenStateError, get_checks_mode

__all__ = ["COMMANDS", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: where its options and its handler live (imported when the parser is built)."""

    name: str
    help: str
    description: str
    module: str
    add_arguments: str | None
    handler: str


COMMANDS: tuple[Command, ...] = (
    Command(
        "verify",
        "the main job: routing checker, token gate and spec ledger for every registered model",
        "Prove that every registered forward honours the stale-host-ids contract: the routing "
        "checker over the registry, the token gate per model (sync vs async vs HF oracle), and the "
        "spec ledger re-proved by running the spec tests. Exit 1 on any finding, divergence or lost "
        "red-before.",
        "tokenstate.tools.verify", "add_verify_arguments", "run_verify",
    ),
    Command(
        "gate",
        "token gate: the same requests through the sync path, the async path and the HF oracle",
        "Run a built-in request set (chunked prefill, mixed prefill/decode steps) through the "
        "synchronous and asynchronous paths of every selected model, and through HF transformers "
        "when installed; report matched/total per request and, on a divergence, the first diverging "
        "step, row, tokens and whether the row was stale. Exit 1 on any divergence.",
        "tokenstate.tools.gate_cli", "add_model_arguments", "run_gate_command",
    ),
    Command(
        "check",
        "routing checker: does every registered forward embed device token ids?",
        "Statically check, per registered forward entry point, that every route that embeds token "
        "ids reads device tokens (or a published scope). Exit 1 on findings.",
        "tokenstate.tools.routing_check", "add_check_arguments", "run_check",
    ),
    Command(
        "specs",
        "the spec ledger: owed/paid items and whether each paid item's red-before was re-proved",
        "Print the spec ledger written by the last pytest run (the tokenstate plugin writes "
        ".tokenstate/ledger.json). Exit 1 when an item failed or lost its red-before.",
        "tokenstate.ledger.report", "add_arguments", "run_specs",
    ),
    Command(
        "demo",
        "show the stale-host-ids contract at work: a stale read refused, checks passing",
        "Build one asynchronous step by hand and show a stale host read being refused while fresh "
        "rows and the device ids stay readable.",
        "tokenstate.tools.demo", None, "run_demo_command",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenstate",
        description="Prove that every registered forward honours device token ids: routing checker, "
        "async-vs-sync token gate and the spec ledger.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        module = importlib.import_module(command.module)
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.description)
        # Also after the command (`tokenstate gate --debug ...`), where the error hint's reader puts
        # it; SUPPRESS keeps the subcommand from resetting a `tokenstate --debug gate` to False.
        sub_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error")
        if command.add_arguments is not None:
            getattr(module, command.add_arguments)(sub_parser)
        sub_parser.set_defaults(handler=getattr(module, command.handler))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        get_checks_mode()  # a bad TOKENSTATE_CHECKS is refused by every command, before it runs
        return int(args.handler(args))
    except TokenStateError as exc:
        if args.debug:
            traceback.print_exc()
        if getattr(args, "json", False):  # --json: a machine reading stdout gets the failure as JSON too
            print(json.dumps({"passed": False, "error": str(exc)}))
        print(f"tokenstate {args.command}: error: {exc}", file=sys.stderr)
        if not args.debug:
            print("hint: run with --debug for the traceback; see `tokenstate --help`.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tokenstate specs --json | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit too
        return 1
