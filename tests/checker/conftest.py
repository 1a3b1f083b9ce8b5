"""The checker zoo: its entry points as targets, its expected verdicts, one shared report."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tokenstate.checker import (
    CheckerConfig,
    CheckReport,
    EntryTarget,
    Verdict,
    check_entry_points,
)

ZOO_ROOT = Path(__file__).parent / "zoo"


def _load_expected() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checker_zoo_expected", ZOO_ROOT / "expected.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXPECTED_MODULE = _load_expected()
EXPECTED: dict[str, tuple[Verdict, str]] = {
    f"{module}.{forward}": (Verdict(verdict), pattern)
    for (module, forward), (verdict, pattern) in _EXPECTED_MODULE.EXPECTED.items()
}


def zoo_config() -> CheckerConfig:
    return CheckerConfig(search_paths=(ZOO_ROOT,), display_root=ZOO_ROOT)


def zoo_targets() -> list[EntryTarget]:
    targets = []
    for module, forward in _EXPECTED_MODULE.EXPECTED:
        build = _EXPECTED_MODULE.BUILD_FUNCTIONS.get((module, forward), (None, None))
        targets.append(EntryTarget(f"{module}.{forward}", module, forward, None, *build))
    return targets


def zoo_file(entry: str) -> Path:
    module = entry.rpartition(".")[0]
    return ZOO_ROOT / (module.replace(".", "/") + ".py")


def run_zoo() -> CheckReport:
    return check_entry_points(zoo_targets(), zoo_config())


def zoo_mismatches(report: CheckReport) -> dict[str, tuple[str, str]]:
    """entry -> (expected, got) for every zoo entry whose verdict is not the expected one."""
    got = {r.entry: r.verdict for r in report.results}
    return {e: (v.value, got[e].value) for e, (v, _) in EXPECTED.items() if got[e] is not v}


@pytest.fixture(scope="session")
def zoo_report() -> CheckReport:
    return run_zoo()


class Zoo:
    """What the zoo tests need, as one fixture (test modules cannot import this conftest)."""

    expected = EXPECTED
    root = ZOO_ROOT
    config = staticmethod(zoo_config)
    targets = staticmethod(zoo_targets)
    file = staticmethod(zoo_file)
    run = staticmethod(run_zoo)
    mismatches = staticmethod(zoo_mismatches)


@pytest.fixture(scope="session")
def zoo() -> type[Zoo]:
    return Zoo


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "zoo_entry" in metafunc.fixturenames:
        metafunc.parametrize("zoo_entry", sorted(EXPECTED))
