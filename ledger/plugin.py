"""The pytest side of the spec ledger: markers, cross-checks, red-before re-runs, the JSON ledger.

Registered by :mod:`tokenstate.pytest_plugin` (which stays import-light); see docs/design/ledger.md.

* ``@pytest.mark.owed("ID")``: a strict expected failure; a pass fails the run with
  "ID now passes: move it to ## Paid and name its before-mutant".
* ``@pytest.mark.paid("ID", before=<Mutant>)``: the test must pass, then is re-run in-process with
  the mutant applied and must fail there, else "red-before lost: ID no longer detects its bug".
* Per test: the marker names an existing item, in the state the spec lists it, and the test is the
  one the spec names. Per spec (a ``specs/<slug>.md`` collected in the run, e.g. by ``pytest`` or
  ``pytest specs``): every item has exactly one test carrying the right marker.
* Results travel in each report's ``user_properties`` so that under pytest-xdist the controller sees
  every worker's results and writes one merged ledger; workers never write it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tokenstate.contracts.errors import ContractDefinitionError
from tokenstate.ledger.ledger import ItemOutcome, Ledger
from tokenstate.ledger.mutants import Mutant
from tokenstate.ledger.spec import (
    Spec,
    SpecItem,
    is_spec_document,
    load_specs,
    looks_like_spec,
    parse_spec,
    spec_documents,
)

__all__ = ["LedgerPlugin"]

MARKERS = ("owed", "paid")
_ITEM_PROP = "tokenstate_item"
_RESULT_PROP = "tokenstate_result"
_RED_BEFORE_PROP = "tokenstate_red_before"
_MUTANT_PROP = "tokenstate_mutant"
_SPEC_CHECK_PROP = "tokenstate_spec_check"


@dataclass(frozen=True)
class Binding:
    item: SpecItem
    mutant: Mutant | None


_BINDING = pytest.StashKey[Binding]()
_PROBLEM = pytest.StashKey[str]()


def _function_name(item: pytest.Item) -> str | None:
    if not isinstance(item, pytest.Function):
        return None
    return (
        f"{item.cls.__name__}::{item.originalname}" if item.cls is not None else item.originalname
    )


class SpecFile(pytest.File):
    """A spec document collected as one cross-check item."""

    def collect(self) -> Iterator[pytest.Item]:
        plugin: LedgerPlugin = self.config.pluginmanager.get_plugin("tokenstate-ledger")
        spec = parse_spec(self.path)  # malformed -> a collection error naming file:line
        yield SpecCheck.from_parent(self, name="cross-check", spec=spec, plugin=plugin)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ContractDefinitionError):
            return str(excinfo.value)  # file:line and what to fix; the plugin's frames say nothing
        return super().repr_failure(excinfo)


class SpecCheck(pytest.Item):
    def __init__(self, *, spec: Spec, plugin: LedgerPlugin, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.plugin = plugin
        self.user_properties.append((_SPEC_CHECK_PROP, spec.slug))

    def runtest(self) -> None:
        self.plugin.specs()
        if self.plugin.spec_error:  # ids clash across specs, say: what is wrong with the set of specs
            raise ContractDefinitionError(f"the specs cannot be read together:\n{self.plugin.spec_error}")
        problems = [p for item in self.spec.items for p in self.plugin.item_problems(item)]
        if problems:
            raise ContractDefinitionError(
                f"spec {self.spec.slug} does not match its tests:\n  " + "\n  ".join(problems)
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ContractDefinitionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"cross-check of {self.spec.slug}"


class LedgerPlugin:
    def __init__(
        self,
        config: pytest.Config,
        spec_dirs: list[Path],
        ledger_path: Path,
        spec_tests_only: bool = False,
    ) -> None:
        self.config = config
        self.root = config.rootpath
        self.spec_dirs = list(dict.fromkeys((d if d.is_absolute() else self.root / d).resolve() for d in spec_dirs))
        self.ledger_path = ledger_path if ledger_path.is_absolute() else self.root / ledger_path
        # --tokenstate-spec-tests: collect the spec documents and the tests they name, nothing else,
        # and always write the ledger (an empty one says there were no specs to re-prove).
        self.spec_tests_only = spec_tests_only
        self._specs: list[Spec] | None = None
        self._spec_error: str | None = None
        self.is_worker = hasattr(config, "workerinput")
        # Collection facts for the per-spec cross-check.
        self.carriers: dict[str, set[tuple[Path, str]]] = {}
        self.misstated: dict[str, str] = {}  # item id -> the node carrying it with the wrong marker
        self.modules: dict[Path, Any] = {}
        # Results seen in this run (from reports, so xdist workers' results arrive here too).
        self.outcomes: dict[str, ItemOutcome] = {}
        self.spec_checks: dict[str, str] = {}

    # -- specs ---------------------------------------------------------------------------------
    def specs(self) -> list[Spec]:
        if self._specs is None:
            try:
                self._specs = load_specs(d for d in self.spec_dirs if d.is_dir())
            except ContractDefinitionError as exc:
                self._spec_error = str(exc)
                self._specs = []
        return self._specs

    def nested_spec_documents(self) -> list[Path]:
        """Markdown files below a spec folder's subfolders that hold an Owed or Paid section: spec
        documents in a place no run reads."""
        found = []
        for folder in self.spec_dirs:
            for path in sorted(folder.rglob("*.md")) if folder.is_dir() else ():
                if path.parent != folder and is_spec_document(path) and looks_like_spec(path):
                    found.append(path)
        return found

    def spec_test_args(self) -> list[str]:
        """What ``--tokenstate-spec-tests`` collects: every spec document of the spec folders and
        each existing test file their items name, wherever it lives (a missing one is reported by
        the spec's cross-check). When the specs cannot be read, only the documents: collecting them
        reports why, naming file:line."""
        documents = [path for d in self.spec_dirs for path in spec_documents(d)]
        test_files = [] if self._spec_error else [i.test_file for s in self.specs() for i in s.items]
        return [str(p) for p in dict.fromkeys([*documents, *(f for f in test_files if f.is_file())])]

    @property
    def spec_error(self) -> str | None:
        """Why the spec documents cannot be read together (None when they can; read them first)."""
        return self._spec_error

    def find(self, item_id: str) -> SpecItem | None:
        return next((i for s in self.specs() for i in s.items if i.id == item_id), None)

    # -- collection ----------------------------------------------------------------------------
    def pytest_collect_file(
        self, file_path: Path, parent: pytest.Collector
    ) -> pytest.Collector | None:
        if is_spec_document(file_path) and file_path.parent.resolve() in self.spec_dirs:
            return SpecFile.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl(tryfirst=True)  # before -k/-m deselection: every collected test counts
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if isinstance(item, pytest.Function):
                self.modules.setdefault(item.path.resolve(), item.module)
            marks = [m for m in item.iter_markers() if m.name in MARKERS]
            if marks:
                problem = self._bind(item, marks)
                if problem is not None:
                    item.stash[_PROBLEM] = problem
        if self.spec_tests_only:  # the named tests' files hold other tests too: those do not run
            named = {(i.test_file, i.test_name) for s in self.specs() for i in s.items}
            keep = [
                item for item in items
                if isinstance(item, SpecCheck) or (item.path.resolve(), _function_name(item)) in named
            ]  # fmt: skip
            if len(keep) < len(items):
                kept = set(keep)
                self.config.hook.pytest_deselected(items=[i for i in items if i not in kept])
                items[:] = keep

    def _bind(self, item: pytest.Item, marks: list[pytest.Mark]) -> str | None:
        where = _test_location(item)
        if len(marks) > 1:
            return f"{where} carries {len(marks)} spec markers; a test carries exactly one item."
        mark = marks[0]
        args_ok = len(mark.args) == 1 and isinstance(mark.args[0], str)
        allowed = {"before"} if mark.name == "paid" else set()
        if not args_ok or set(mark.kwargs) - allowed:
            usage = (
                '@pytest.mark.paid("ID", before=<mutant>)'
                if mark.name == "paid"
                else '@pytest.mark.owed("ID")'
            )
            return f"{where}: bad marker {mark.name}{mark.args}{mark.kwargs}; write {usage}."
        item_id = mark.args[0]
        self.specs()
        if self._spec_error:
            return f"{where}: the specs cannot be read:\n{self._spec_error}"
        spec_item = self.find(item_id)
        if spec_item is None:
            listed = ", ".join(s.slug for s in self.specs()) or "none: " + ", ".join(
                f"{d} {'holds no spec document' if d.is_dir() else 'does not exist'}" for d in self.spec_dirs
            )
            return (
                f"{where}: orphan marker @pytest.mark.{mark.name}({item_id!r}) names no item of any spec "
                f"(specs: {listed}); add the item to a spec or fix the id."
            )
        item.user_properties.append((_ITEM_PROP, item_id))
        self.carriers.setdefault(item_id, set()).add(
            (item.path.resolve(), _function_name(item) or where)
        )
        if mark.name != spec_item.state:
            self.misstated[item_id] = f"{where} (@pytest.mark.{mark.name})"
            return (
                f"{where}: {item_id} is listed under ## {spec_item.state.title()} ({spec_item.where}) but "
                f"the test is marked {mark.name}; make the marker and the spec agree."
            )
        if (item.path.resolve(), _function_name(item)) != (
            spec_item.test_file,
            spec_item.test_name,
        ):
            return (
                f"{where}: {spec_item.where} names `{spec_item.test}` as the test carrying {item_id}, but "
                "this test carries its marker; move the marker or fix the spec."
            )
        mutant = mark.kwargs.get("before")
        if mark.name == "paid" and isinstance(item, pytest.Function) and _is_unittest(item):
            return (
                f"{where}: paid {item_id} is a unittest.TestCase method, which cannot be re-run under its "
                "mutant (unittest keeps its failures to itself); write the test as a pytest function or "
                "method of a plain class."
            )
        if mark.name == "paid":
            if not isinstance(mutant, Mutant):
                return f"{where}: paid {item_id} needs before=<Mutant> (a @mutant-declared patch), got {mutant!r}."
            if mutant.item_id != item_id:
                return f"{where}: mutant {mutant.name} belongs to {mutant.item_id}, not {item_id}."
            item.user_properties.append((_MUTANT_PROP, (mutant.name, mutant.doc)))
        item.stash[_BINDING] = Binding(spec_item, mutant)
        return None

    def item_problems(self, spec_item: SpecItem) -> list[str]:
        """Why ``spec_item`` is not carried by exactly one test, with the right marker (empty if it is)."""
        named = (spec_item.test_file, spec_item.test_name)
        carriers = self.carriers.get(spec_item.id, set())
        at = f"{spec_item.where}: {spec_item.id}"
        others = sorted(f"{p}::{n}" for p, n in carriers - {named})
        if others:
            typo = spec_item.test_file in self.modules and self._named_test(spec_item) is None
            missing = f" (`{spec_item.test_name}` does not exist in {spec_item.test_file.name}: a typo in the spec?)" if typo else ""
            return [
                f"{at} is carried by {', '.join(others)} instead of / besides `{spec_item.test}`{missing}."
            ]
        if spec_item.id in self.misstated:
            return [f"{at} is listed under ## {spec_item.state.title()} but {self.misstated[spec_item.id]} carries it."]
        if named in carriers:
            return []
        module = self.modules.get(spec_item.test_file)
        if module is None:
            return [
                f"{at}: its test file {spec_item.test_file} was not collected in this run, so the item is "
                "unchecked; run the spec together with its tests (`pytest --tokenstate-spec-tests` "
                "collects every spec with the tests it names)."
            ]
        test = self._named_test(spec_item)
        if not callable(test):
            return [
                f"{at} has no test: `{spec_item.test}` does not exist; write it or fix the spec."
            ]
        if not _collected_name(self.config, spec_item.test_name):
            patterns = " ".join(self.config.getini("python_functions"))
            classes = " ".join(self.config.getini("python_classes"))
            return [
                f"{at}: `{spec_item.test}` is not a test pytest collects (python_functions = {patterns}, "
                f"python_classes = {classes}), so the item is never checked; rename it or fix the spec."
            ]
        marks = [
            m
            for m in getattr(test, "pytestmark", [])
            if m.name in MARKERS and m.args[:1] == (spec_item.id,)
        ]
        if not any(m.name == spec_item.state for m in marks):
            return [
                f"{at} ({spec_item.state}): `{spec_item.test}` has no @pytest.mark.{spec_item.state}({spec_item.id!r})."
            ]
        return []  # carried correctly, just deselected from this run

    def _named_test(self, spec_item: SpecItem) -> Any:
        """The test function the spec names, from its collected module (None when absent)."""
        test = self.modules.get(spec_item.test_file)
        for part in spec_item.test_name.split("::"):
            test = getattr(test, part, None)
        return test

    # -- running -------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        problem = item.stash.get(_PROBLEM, None)
        if problem is not None:
            pytest.fail(problem, pytrace=False)

    # innermost (trylast): the re-runs happen inside the capture of the test's call, so a test reading
    # capsys/capfd sees its re-runs' output as it saw its own
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        result = yield  # the test's own run; a failure propagates untouched
        binding = item.stash.get(_BINDING, None)
        if binding is not None and binding.mutant is not None:
            try:
                detected, how = _red_before(item, binding.mutant)
            except ContractDefinitionError as exc:  # a broken mutant is no evidence: say why, in one line
                item.user_properties.append((_RED_BEFORE_PROP, False))
                pytest.fail(f"{binding.item.id}: {exc}", pytrace=False)
            item.user_properties.append((_RED_BEFORE_PROP, detected))
            if not detected:
                item.user_properties.append((_RESULT_PROP, "red-before-lost"))
                if how.startswith("misfits: "):
                    pytest.fail(
                        f"red-before not proved: {binding.item.id}'s test {how.removeprefix('misfits: ')} — a "
                        f"call's arguments refused, so mutant {binding.mutant.name} no longer fits the code it "
                        f"patches and its failure proves nothing about the bug. Give the replacement the "
                        f"parameters of what it replaces ({binding.item.where}).",
                        pytrace=False,
                    )
                if how.startswith("fails again"):
                    pytest.fail(
                        f"red-before not proved: {binding.item.id}'s test {how}, so its failure under mutant "
                        f"{binding.mutant.name} proves nothing about the bug. Keep the test re-runnable on its "
                        f"own fixtures: it runs three times — as itself, under the mutant, and again without "
                        f"it — with the same fixture values (a file created with mode 'x' in tmp_path, "
                        f"module state, a counter...) ({binding.item.where}).",
                        pytrace=False,
                    )
                pytest.fail(
                    f"red-before lost: {binding.item.id} no longer detects its bug — the test {how} under "
                    f"mutant {binding.mutant.name} ({binding.mutant.doc}). Make the test fail on the bug "
                    f"again ({binding.item.where}); or, if the test is right, make the mutant reach the "
                    f"code: a patch of module.name misses a copy taken by `from module import name`.",
                    pytrace=False,
                )
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        binding = item.stash.get(_BINDING, None)
        if binding is not None and binding.item.state == "paid":
            return _paid_must_run(report, binding.item)
        if binding is None or call.when != "call" or binding.item.state != "owed":
            return report
        if call.excinfo is None:  # the test body passed, whatever an xfail mark made of the report
            report.outcome = "failed"
            report.longrepr = (
                f"{binding.item.id} now passes: move it to ## Paid and name its before-mutant "
                f"({binding.item.where})."
            )
            if hasattr(report, "wasxfail"):  # a non-strict xfail's XPASS would keep the run green
                del report.wasxfail
            report.user_properties.append((_RESULT_PROP, "xpassed"))
        elif report.failed:
            report.outcome = "skipped"
            reason = call.excinfo.exconly().splitlines()[0][:160] if call.excinfo else "failed"
            report.wasxfail = f"owed {binding.item.id}, still failing: {reason}"
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(tuple(p) for p in report.user_properties)
        if _SPEC_CHECK_PROP in props and report.when == "call":
            self.spec_checks[props[_SPEC_CHECK_PROP]] = report.outcome
        if _ITEM_PROP not in props:
            item_id = self._item_of_unreported(report)
            if item_id is not None:  # an xdist worker crashed in it: its report carries nothing of ours
                self.outcomes.setdefault(item_id, ItemOutcome()).add(report.nodeid, "error", None)
            return
        outcome = self.outcomes.setdefault(props[_ITEM_PROP], ItemOutcome())
        if _MUTANT_PROP in props:
            outcome.mutant, outcome.mutant_doc = props[_MUTANT_PROP]
        if report.when == "call":
            result = props.get(_RESULT_PROP) or (
                "xfailed" if hasattr(report, "wasxfail") else report.outcome
            )
            outcome.add(report.nodeid, result, props.get(_RED_BEFORE_PROP))
        elif report.failed:
            outcome.add(report.nodeid, props.get(_RESULT_PROP) or "error", None)  # a paid test skipped at setup
        elif report.skipped and report.when == "setup":
            outcome.add(report.nodeid, "skipped", None)

    def _item_of_unreported(self, report: pytest.TestReport) -> str | None:
        """The spec item a failed report without our properties belongs to (the test it names)."""
        if not report.failed or self._spec_error:
            return None
        path, _, name = report.nodeid.partition("::")
        function = name.partition("[")[0]
        test_file = (self.root / path).resolve()
        return next(
            (i.id for s in self.specs() for i in s.items if (i.test_file, i.test_name) == (test_file, function)),
            None,
        )

    # -- the ledger ----------------------------------------------------------------------------
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        spec_run = self.spec_tests_only and not self.config.option.collectonly
        if self.is_worker:
            return
        if not (self.outcomes or self.spec_checks or spec_run):
            # nothing of the specs ran — but where they no longer parse (a collection error stopped
            # the run), the last ledger must not go on reporting a healthy state
            if not any(spec_documents(d) for d in self.spec_dirs if d.is_dir()):
                return
            self.specs()
            if not self._spec_error:
                return
        specs = self.specs()
        if self._spec_error:
            self._write(session, Ledger.unreadable(self.root, self.spec_dirs, self._spec_error))
            return
        previous = None
        if self.ledger_path.is_file() and not spec_run:  # a full spec run proves everything anew
            try:
                previous = Ledger.read(self.ledger_path)
            except Exception:  # an unreadable old ledger is simply replaced
                previous = None
        ledger = Ledger.build(
            specs, self.root, self.outcomes, self.spec_checks, previous, spec_dirs=self.spec_dirs
        )
        self._write(session, ledger)

    def _write(self, session: pytest.Session, ledger: Ledger) -> None:
        try:
            ledger.write(self.ledger_path)
        except OSError as exc:  # a read-only checkout, say: the run fails, saying where and why
            self._write_error = (
                f"tokenstate ledger: cannot write {self.ledger_path} ({exc.strerror or exc}); pass "
                "--tokenstate-ledger=PATH with a writable path."
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        self._written = ledger

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        problem: str | None = getattr(self, "_write_error", None)
        if problem is not None:
            terminalreporter.write_line(problem, red=True)
        ledger: Ledger | None = getattr(self, "_written", None)
        if ledger is None:
            return
        paid = [e for e in ledger.items if e.state == "paid"]
        verified = sum(1 for e in paid if e.red_before_verified)
        owed = len(ledger.items) - len(paid)
        terminalreporter.write_line(
            f"tokenstate ledger: {len(paid)} paid ({verified} red-before verified), {owed} owed -> "
            f"{self.ledger_path}"
        )


def _collected_name(config: pytest.Config, test_name: str) -> bool:
    """Whether pytest collects ``Class::function`` by name (its python_classes and python_functions
    options: a prefix, or a glob)."""
    *classes, function = test_name.split("::")

    def matches(name: str, option: str) -> bool:
        return any(
            name.startswith(p) or (any(c in p for c in "*?[") and fnmatch.fnmatch(name, p))
            for p in config.getini(option)
        )

    return matches(function, "python_functions") and all(matches(c, "python_classes") for c in classes)


def _paid_must_run(report: pytest.TestReport, item: SpecItem) -> pytest.TestReport:
    """A paid item's report, failed where an xfail mark or a skip would hide that the promise was
    not re-proved: a paid test must pass, and fail under its mutant, on every run that collects it."""
    if hasattr(report, "wasxfail"):  # xfailed (a failure the mark excused) or xpassed
        del report.wasxfail
        if not any(name == _RESULT_PROP for name, _ in report.user_properties):
            report.user_properties.append((_RESULT_PROP, "failed"))
        report.outcome = "failed"
        report.longrepr = (
            f"{item.id} is paid, but its test is marked xfail ({item.where}): an xfail mark hides the "
            f"failures a paid test exists to show. Remove the mark, or move the item back to ## Owed."
            + (f"\n{report.longreprtext}" if report.longreprtext else "")
        )
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.user_properties.append((_RESULT_PROP, "skipped"))
        report.longrepr = (
            f"{item.id} is paid, but its test was skipped ({reason}): a paid promise is re-proved on every "
            f"run that collects its test. Make the test run here, or move the item to ## Owed "
            f"({item.where})."
        )
    return report


def _is_unittest(item: pytest.Function) -> bool:
    import unittest

    return item.cls is not None and issubclass(item.cls, unittest.TestCase)


_ARGUMENTS_REFUSED = re.compile(r"\bpositional arguments?\b|\bkeyword arguments?\b|\bargument '")
"""What a ``TypeError`` says when a call does not fit the callee's parameters."""


def _red_before(item: pytest.Item, mutant: Mutant) -> tuple[bool, str]:
    """Re-run the test's function in-process with the mutant applied, where it must fail, then
    once more without it, where it must pass again: ``(red before?, how it went)``. The control
    run is what makes the failure the mutant's: a test that fails on any second run (a file it
    creates exclusively, module state it consumes) would otherwise count as red-before evidence
    for a mutant that never reached the code.

    Errors applying the mutant itself propagate (a broken mutant is not red-before evidence).
    """
    with mutant.applied():
        try:
            item.runtest()
        except pytest.skip.Exception:
            return False, "was skipped"
        except (Exception, pytest.fail.Exception) as exc:
            if isinstance(exc, TypeError) and _ARGUMENTS_REFUSED.search(str(exc)):
                # a call that no longer fits: the mutant's replacement, or what it calls, has drifted
                return False, f"misfits: fails under it only with TypeError: {(str(exc).splitlines() or [''])[0][:160]}"
            failure = type(exc).__name__
        else:
            return False, "still passes"
    try:
        item.runtest()
    except (Exception, pytest.fail.Exception, pytest.skip.Exception) as exc:
        first = (str(exc).splitlines() or [""])[0][:160]
        return False, f"fails again without its mutant ({type(exc).__name__}: {first})"
    return True, f"failed with {failure}"


def _test_location(item: pytest.Item) -> str:
    """``nodeid (line N)``: the test a marker message is about, and the line its ``def`` is on."""
    _, line, _ = item.reportinfo()
    return item.nodeid if line is None else f"{item.nodeid} (line {line + 1})"
