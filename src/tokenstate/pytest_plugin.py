"""The tokenstate pytest plugin (entry point ``pytest11: tokenstate``).

It provides the spec-ledger markers (``@pytest.mark.owed("ID")``, ``@pytest.mark.paid("ID",
before=<mutant>)``), their cross-checks and the JSON ledger; ``--tokenstate-checks``, which
runs the session under beartype's import hook for every ``tokenstate`` module — and for your own
packages, named with ``--tokenstate-checks-package PKG`` (repeatable; it implies
``--tokenstate-checks``) or the ``tokenstate_checks_packages`` ini option; and the
``tokenstate_gate`` fixture (:func:`tokenstate.testing.assert_async_equals_sync`). The pytest header
says when the checks are on and which packages they cover.

This module lives in the tiny top package on purpose and imports nothing of ``tokenstate`` at import
time: pytest loads it before any test or conftest, and the import hook can only type-check modules
that are imported *after* it is installed. The ledger implementation is imported lazily, once the
hook (if asked for) is in place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CHECKS_OPTION", "CHECKS_PACKAGE_OPTION", "LEDGER_OPTION", "SPEC_TESTS_OPTION"]

CHECKS_OPTION = "--tokenstate-checks"
CHECKS_PACKAGE_OPTION = "--tokenstate-checks-package"
# Left to their own checks: modules of registered forwards (an ``@entry_point`` already checks every
# call, and beartype would replace the EntryPoint wrapper by a plain function); the routing
# checker, whose mixins annotate ``self`` with the engine class for static analysis only; and the
# public API that takes a user's arguments (LLM, SamplingParams, the registry, the gate and its
# assertion): each validates them itself with a ConfigError that says what to do, and accepts
# more than its annotations name (vLLM's ``None`` defaults, numpy ids), so beartype would refuse
# documented inputs and pre-empt those messages.
CLAW_SKIPPED = (
    "tokenstate.models", "tokenstate.models.toy", "tokenstate.checker",
    "tokenstate.runtime.llm", "tokenstate.runtime.params", "tokenstate.runtime.registry",
    "tokenstate.testing", "tokenstate.tools.gate",
)  # fmt: skip
LEDGER_OPTION = "--tokenstate-ledger"
SPEC_TESTS_OPTION = "--tokenstate-spec-tests"
_CLAW_KEY = pytest.StashKey[tuple[str, ...]]()  # the packages beartype's hook covers in this run

# Modules of ours that may legitimately be imported before the hook: this package's own
# ``__init__`` (pytest imports it to reach this module) and this plugin.
_IMPORTED_BEFORE_HOOK_OK = frozenset({"tokenstate", __name__})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tokenstate", "tokenstate spec ledger and runtime checks")
    group.addoption(
        CHECKS_OPTION,
        action="store_true",
        default=False,
        help="type-check every tokenstate module with beartype's import hook "
        "(beartype.claw.beartype_packages) for this run, and the packages named with "
        f"{CHECKS_PACKAGE_OPTION}.",
    )
    group.addoption(
        CHECKS_PACKAGE_OPTION,
        action="append",
        default=[],
        metavar="PKG",
        help=f"also type-check your package PKG under beartype's import hook (implies {CHECKS_OPTION}); "
        "repeatable.",
    )
    group.addoption(
        LEDGER_OPTION,
        metavar="PATH",
        default=None,
        help="where to write the spec ledger JSON (default: <rootdir>/.tokenstate/ledger.json).",
    )
    group.addoption(
        SPEC_TESTS_OPTION,
        action="store_true",
        default=False,
        help="run the spec ledger alone: collect the spec documents of the tokenstate_specs folders "
        "and exactly the tests their items name, wherever those live, instead of test paths "
        "(what `tokenstate verify` runs).",
    )
    parser.addini(
        "tokenstate_specs",
        type="paths",
        default=["specs"],
        help="directories (relative to the ini file) holding spec documents <slug>.md.",
    )
    parser.addini(
        "tokenstate_checks_packages",
        type="linelist",
        default=[],
        help=f"your packages to type-check under beartype's import hook when {CHECKS_OPTION} is on.",
    )


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _imported_too_early(packages: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in sys.modules if _in(name, packages) and name not in _IMPORTED_BEFORE_HOOK_OK
    )


def _checked_packages(config: pytest.Config, named: list[str]) -> tuple[str, ...]:
    """``tokenstate`` plus the user's packages (command line, then ini), each once."""
    user = [*named, *config.getini("tokenstate_checks_packages")]
    for name in user:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise pytest.UsageError(
                f"{CHECKS_PACKAGE_OPTION} {name!r}: not a package name; pass an importable dotted "
                "name such as myengine or myengine.models."
            )
        top = name.partition(".")[0]
        if not _findable(top, config):
            raise pytest.UsageError(
                f"{CHECKS_PACKAGE_OPTION} {name!r}: no package {top!r} is installed or importable "
                "from here, so nothing would be checked; check the spelling, or install the package "
                "(pip install -e .)."
            )
    return tuple(dict.fromkeys(("tokenstate", *user)))


def _findable(top: str, config: pytest.Config) -> bool:
    """Whether top-level package ``top`` is installed or sits where the tests will import it from
    (the rootdir, its ``src/``, the invocation directory) — found without importing it."""
    if importlib.util.find_spec(top) is not None:
        return True
    folders = {config.rootpath, config.rootpath / "src", Path(config.invocation_params.dir)}
    return any((folder / top / "__init__.py").is_file() or (folder / f"{top}.py").is_file() for folder in folders)


def _install_checks_hook(config: pytest.Config, named: list[str]) -> None:
    """Install beartype's import hook for ``tokenstate`` and the user's packages, refusing if it
    could not take effect."""
    if config.stash.get(_CLAW_KEY, None) is not None:
        return
    packages = _checked_packages(config, named)
    early = _imported_too_early(packages)
    if early:
        raise pytest.UsageError(
            f"{CHECKS_OPTION}: these modules were imported before beartype's import hook could be "
            f"installed, so they would run unchecked: {', '.join(early)}. Something loaded them at "
            "startup (another plugin, a -p option, or a sitecustomize); remove that import or run "
            f"without {CHECKS_OPTION}."
        )
    from beartype import BeartypeConf
    from beartype.claw import beartype_packages

    _stop_assertion_rewriting_of(packages)
    beartype_packages(packages, conf=BeartypeConf(claw_skip_package_names=CLAW_SKIPPED))
    config.stash[_CLAW_KEY] = packages


def _stop_assertion_rewriting_of(packages: tuple[str, ...]) -> None:
    """Keep pytest's assertion rewriter from loading the checked packages' modules.

    pytest marks every package of a distribution that provides a ``pytest11`` plugin for assertion
    rewriting (with a regular or strict-editable install that is all of ``tokenstate``), and its
    import hook sits first on ``sys.meta_path`` — so it would load our modules itself and beartype's
    path hook would never see them. Our package holds no test assertions to rewrite.
    """
    from _pytest.assertion.rewrite import AssertionRewritingHook

    for finder in sys.meta_path:
        if isinstance(finder, AssertionRewritingHook):
            marked = getattr(finder, "_must_rewrite", None)
            if not isinstance(marked, set):
                raise pytest.UsageError(
                    f"{CHECKS_OPTION}: this pytest version's assertion rewriter cannot be told to "
                    "leave tokenstate alone; run with --assert=plain as well."
                )
            marked.difference_update({n for n in marked if _in(n, packages)})


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Earliest point where options are parsed and before any conftest.py runs: conftests import
    # tokenstate modules, and those must already go through the hook.
    known = early_config.known_args_namespace
    if known.tokenstate_checks or known.tokenstate_checks_package:
        _install_checks_hook(early_config, known.tokenstate_checks_package)


def pytest_report_header(config: pytest.Config) -> str | None:
    packages = config.stash.get(_CLAW_KEY, None)
    if packages is None:
        return None
    return f"tokenstate: {CHECKS_OPTION} on (beartype import hook for {', '.join(packages)})"


@pytest.fixture
def tokenstate_gate():  # type: ignore[no-untyped-def]
    """:func:`tokenstate.testing.assert_async_equals_sync`, as a fixture for your own tests."""
    from tokenstate.testing import assert_async_equals_sync

    return assert_async_equals_sync


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "owed(item_id): the test carries a spec item listed under ## Owed — a strict expected "
        "failure; the run fails when it passes.",
    )
    config.addinivalue_line(
        "markers",
        "paid(item_id, before=mutant): the test carries a spec item listed under ## Paid — it must "
        "pass, and must fail when re-run under `before`, the mutant that reverts the fix.",
    )
    named = config.getoption("tokenstate_checks_package")
    if config.getoption("tokenstate_checks") or named:
        _install_checks_hook(config, named)
    from tokenstate.contracts import ConfigError, get_checks_mode
    from tokenstate.ledger.plugin import LedgerPlugin

    try:
        get_checks_mode()  # a bad TOKENSTATE_CHECKS is refused once, before any test runs
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    ledger_option = config.getoption("tokenstate_ledger")
    ledger_path = (
        config.invocation_params.dir / ledger_option  # as typed: relative to where pytest ran
        if ledger_option
        else config.rootpath / ".tokenstate" / "ledger.json"
    )
    if ledger_option:
        _require_writable(ledger_path)
    spec_dirs = [Path(p) for p in config.getini("tokenstate_specs")]
    spec_tests_only = config.getoption("tokenstate_spec_tests")
    plugin = LedgerPlugin(config, spec_dirs, ledger_path, spec_tests_only)
    config.pluginmanager.register(plugin, "tokenstate-ledger")
    if spec_tests_only:
        _select_spec_tests(config, plugin, configured=[Path(p) for p in spec_dirs] != [Path("specs")])


def _select_spec_tests(config: pytest.Config, plugin: Any, configured: bool) -> None:
    """``--tokenstate-spec-tests``: the session collects the spec documents and the tests they
    name, every case of them (a ``-m`` in addopts deselects none: the run re-proves the ledger)."""
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        raise pytest.UsageError(
            f"{SPEC_TESTS_OPTION} collects the spec documents and the tests they name itself; drop the "
            f"test paths given on the command line or in addopts ({' '.join(config.args)}), or drop "
            f"{SPEC_TESTS_OPTION}."
        )
    missing = [str(d) for d in plugin.spec_dirs if not d.is_dir()] if configured else []
    if missing:
        raise pytest.UsageError(
            f"{SPEC_TESTS_OPTION}: the spec folders {', '.join(missing)} named by tokenstate_specs do not "
            "exist; fix the ini option (paths are relative to the configuration file)."
        )
    nested = plugin.nested_spec_documents()
    if nested:
        raise pytest.UsageError(
            f"{SPEC_TESTS_OPTION}: {', '.join(map(str, nested[:3]))} look like spec documents but sit in a "
            "subfolder of a spec folder, where they are never read; add their folder to tokenstate_specs "
            "or move them up."
        )
    config.option.markexpr = ""
    config.args = plugin.spec_test_args()  # read by the session's collection, after configure


def _require_writable(path: Path) -> None:
    """Refuse, before any test runs, a ledger path the run could not write at its end."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    problem = None
    if path.is_dir():
        problem = "it is a directory; name a file (e.g. build/ledger.json)"
    elif existing != path and not existing.is_dir():
        problem = f"{existing} is a file, not a directory"
    elif not os.access(existing if existing != path else path.parent, os.W_OK):
        problem = f"{existing if existing != path else path.parent} is not writable"
    if problem:
        raise pytest.UsageError(f"{LEDGER_OPTION} {path}: the ledger cannot be written there: {problem}.")
