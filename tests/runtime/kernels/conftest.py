"""Fixtures for the kernel tests: the shared random-case module, loaded by path.

The tests run with ``--import-mode=importlib``, so sibling helper modules are not importable by
name; ``_kernel_cases.py`` is also the script the Triton-interpreter subprocess runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CASES_PATH = Path(__file__).with_name("_kernel_cases.py")


def _load_cases() -> ModuleType:
    name = "tokenstate_tests_kernel_cases"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CASES_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def cases() -> ModuleType:
    return _load_cases()
