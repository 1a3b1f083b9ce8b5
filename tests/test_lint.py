"""Style is part of the build: ruff (configured in pyproject.toml) must pass on the whole tree."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    beside = pathlib.Path(sys.executable).with_name("ruff")  # the test extra's ruff, in this venv
    ruff = str(beside) if beside.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the test extra)")
    out = subprocess.run([ruff, "check", "--output-format", "concise", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
