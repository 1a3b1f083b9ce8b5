"""The how-to's example spec (docs/how-to/spec-example/) really works: run pytest in a copy of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "spec-example"


def test_example_spec_runs_green_with_red_before_verified(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".tokenstate"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TOKENSTATE_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:xdist",
            "--rootdir",
            str(project),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed, 1 xfailed" in proc.stdout, proc.stdout
    items = {
        e["id"]: e
        for e in json.loads((project / ".tokenstate" / "ledger.json").read_text())["items"]
    }
    assert items["TINY-1"]["state"] == "paid" and items["TINY-1"]["last_result"] == "passed"
    assert items["TINY-1"]["red_before_verified"] is True
    assert items["TINY-1"]["mutant"] == "TINY-1/embeds-host-buffer"
    assert items["TINY-2"]["state"] == "owed" and items["TINY-2"]["last_result"] == "xfailed"
