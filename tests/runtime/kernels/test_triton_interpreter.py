"""Triton kernels under TRITON_INTERPRET=1 == their torch twins, on seeded random inputs.

The interpreter flag must be set before triton is first imported, and this pytest process may
already have imported it (torch does on some paths), so the kernels run in one subprocess that
executes ``_kernel_cases.py``; each test here checks one line of its JSON verdict.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES_SCRIPT = Path(__file__).with_name("_kernel_cases.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, str(CASES_SCRIPT)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"interpreter run failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "check",
    ["combine", "predicate_pinned", "embedding", "post_update", "verify_drafts"],
)
def test_triton_kernel_matches_its_twin_under_the_interpreter(
    verdicts: dict[str, str], check: str
) -> None:
    assert verdicts[check] == "ok", verdicts[check]
