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
