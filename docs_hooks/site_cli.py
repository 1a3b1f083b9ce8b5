"""The CLI reference page, generated from ``tokenstate.tools.cli.build_parser()`` at build time.

Whatever subcommands the parser has when the site is built are the ones documented, so the page
cannot drift from the command line. argparse keeps its actions in private attributes; reading them
is the only way to walk a parser, and the test of the built site fails loudly if that ever changes.
"""

from __future__ import annotations

import argparse
import html
import os
import re

__all__ = ["render_cli_page"]

_WIDTH = 100


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    """Format usage at a fixed width, so the page does not depend on the building terminal."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=_WIDTH)  # type: ignore[assignment]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _cell(text: str) -> str:
    return html.escape(" ".join(text.split())).replace("|", "&#124;")


_HELP_DEFAULT = re.compile(r"\(default: ([^()]*(?:\([^()]*\)[^()]*)*)\)")


def _shown_default(action: argparse.Action) -> str:
    """What the option is when not given: a flag is off, a repeatable option empty, a ``None``
    default whatever the help text says it falls back to."""
    if action.nargs == 0:
        return "off"
    stated = _HELP_DEFAULT.search(action.help or "")
    if action.default is None or action.default == []:
        if stated:
            return stated.group(1)
        return "none" if action.default == [] else "not set"
    if isinstance(action.default, str | os.PathLike):
        return os.fspath(action.default)
    return repr(action.default)


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            name = ", ".join(f"{opt}{metavar}" for opt in action.option_strings)
        else:
            name = str(action.metavar or action.dest)
        shown_default = _shown_default(action)
        choices = ", ".join(map(str, action.choices)) if action.choices else ""
        rows.append(
            f"| <code>{_cell(name)}</code> | {_cell(action.help or '')} | {_cell(choices)} | {_cell(shown_default)} |"
        )
    return rows


def _section(parser: argparse.ArgumentParser, title: str, level: int, help_text: str) -> list[str]:
    _fixed_width(parser)
    out = [f"{'#' * level} `{title}`", ""]
    if help_text:
        out += [help_text[0].upper() + help_text[1:] + ("" if help_text.endswith(".") else "."), ""]
    if parser.description and parser.description != help_text:
        out += [parser.description, ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    rows = _argument_rows(parser)
    if rows:
        out += ['<div class="ts-cli" markdown="1">', "", "| Argument | What | Choices | Default |",
                "|---|---|---|---|", *rows, "", "</div>", ""]
    return out


def render_cli_page(parser: argparse.ArgumentParser) -> str:
    """Markdown for the whole command line: the top command, then every subcommand."""
    out = [
        "# Command line",
        "",
        f"The `{parser.prog}` command is installed with the package (`python -m tokenstate` runs the "
        "same). This page is generated from the argument parser when the site is built. Errors are "
        "printed as one line with a hint and exit with status 2; `--debug` shows the traceback.",
        "",
    ]
    out += _section(parser, parser.prog, 2, "")
    sub = _subparsers(parser)
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            out += _section(child, f"{parser.prog} {name}", 2, helps.get(name, ""))
            grandchildren = _subparsers(child)
            if grandchildren is not None:
                inner_helps = {a.dest: a.help or "" for a in grandchildren._choices_actions}
                for inner, grandchild in grandchildren.choices.items():
                    out += _section(
                        grandchild, f"{parser.prog} {name} {inner}", 3, inner_helps.get(inner, "")
                    )
    return "\n".join(out).rstrip() + "\n"
