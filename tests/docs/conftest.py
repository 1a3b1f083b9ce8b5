"""Shared fixtures of the docs tests: one strict build of the site per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "docs_hooks"


def _ledger_snapshot(folder: Path) -> Path:
    """A ledger the build reads and the tests compare against, fixed for the whole session.

    The repository's ledger is copied (other pytest runs may rewrite it while this one runs); without
    one (a fresh clone), every item gets the result its state expects, so the ledger rendering path
    is still exercised end to end.
    """
    from tokenstate.ledger import Ledger, load_specs

    snapshot = folder / "ledger.json"
    repo_ledger = REPO / ".tokenstate" / "ledger.json"
    if repo_ledger.is_file():
        shutil.copyfile(repo_ledger, snapshot)
        try:
            Ledger.read(snapshot)
            return snapshot
        except Exception:  # half-written by a concurrent run? fall back to the synthetic one
            pass
    ledger = Ledger.build(load_specs([REPO / "specs"]), REPO, {}, {})
    for entry in ledger.items:
        entry.last_result = "passed" if entry.state == "paid" else "xfailed"
        entry.red_before_verified = True if entry.state == "paid" else None
    ledger.write(snapshot)
    return snapshot


@pytest.fixture(scope="session")
def site_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ledger_snapshot(tmp_path_factory.mktemp("ledger"))


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory, site_ledger: Path) -> Path:
    """``mkdocs build --strict`` of the repository's site into a temporary folder."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "TOKENSTATE_DOCS_LEDGER": str(site_ledger)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=tmp_path_factory.getbasetemp(),  # not the repository: the build must not depend on it
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site


@pytest.fixture
def hooks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the docs hook modules importable, as mkdocs does when it loads docs_hooks/hooks.py."""
    monkeypatch.syspath_prepend(str(HOOKS))
