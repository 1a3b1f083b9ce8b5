"""The ``tokenstate`` command line.

Every subcommand lives in its own small module and is registered here; errors become one clear
line plus a hint (``--debug`` shows the traceback), never an internal traceback by default.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from tokenstate.contracts import TokenStateError

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


def _demo(args: argparse.Namespace) -> int:
    from tokenstate.runtime.demo import run_demo

    return run_demo()


def _check(args: argparse.Namespace) -> int:
    from tokenstate.runtime.routing_check import run_check

    return run_check(args)


def _gate(args: argparse.Namespace) -> int:
    from tokenstate.runtime.gate_cli import run_gate_command

    return run_gate_command(args)


def _verify(args: argparse.Namespace) -> int:
    from tokenstate.runtime.verify import run_verify

    return run_verify(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenstate",
        description="Prove that every registered forward honours device token ids: routing checker, "
        "async-vs-sync token gate and the spec ledger.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = sub.add_parser(
        "demo", help="show the stale-host-ids contract at work: a stale read refused, checks passing"
    )
    demo.set_defaults(handler=_demo)
    from tokenstate.runtime.routing_check import add_check_arguments

    check = sub.add_parser(
        "check",
        help="routing checker: does every registered forward embed device token ids?",
        description="Statically check, per registered forward entry point, that every route that "
        "embeds token ids reads device tokens (or a published scope). Exit 1 on findings.",
    )
    add_check_arguments(check)
    check.set_defaults(handler=_check)
    from tokenstate.contracts.ledger.report import add_arguments as add_specs_arguments, run_specs

    specs = sub.add_parser(
        "specs",
        help="the spec ledger: owed/paid items and whether each paid item's red-before was re-proved",
        description="Print the spec ledger written by the last pytest run (the tokenstate plugin "
        "writes .tokenstate/ledger.json). Exit 1 when an item failed or lost its red-before.",
    )
    add_specs_arguments(specs)
    specs.set_defaults(handler=run_specs)
    from tokenstate.runtime.gate_cli import add_model_arguments
    from tokenstate.runtime.verify import add_verify_arguments

    gate = sub.add_parser(
        "gate",
        help="token gate: the same requests through the sync path, the async path and the HF oracle",
        description="Run a built-in request set (chunked prefill, mixed prefill/decode steps) through "
        "the synchronous and asynchronous paths of every selected model, and through HF transformers "
        "when installed; report matched/total per request and, on a divergence, the first diverging "
        "step, row, tokens and whether the row was stale. Exit 1 on any divergence.",
    )
    add_model_arguments(gate)
    gate.set_defaults(handler=_gate)
    verify = sub.add_parser(
        "verify",
        help="the main job: routing checker, token gate and spec ledger for every registered model",
        description="Prove that every registered forward honours the stale-host-ids contract: the "
        "routing checker over the registry, the token gate per model (sync vs async vs HF oracle), "
        "and the spec ledger re-proved by running the spec tests. Exit 1 on any finding, divergence "
        "or lost red-before.",
    )
    add_verify_arguments(verify)
    verify.set_defaults(handler=_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except TokenStateError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"tokenstate {args.command}: error: {exc}", file=sys.stderr)
        print("hint: run with --debug for the traceback; see `tokenstate --help`.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
