"""P6: wall time of the test suite on this machine (default tier; optionally the slow tier too).

Run: ``python benchmarks/suite_time.py [--slow]``. Runs ``python -m pytest -n 2 -q`` (the default
tier: ``-m "not slow"`` from pyproject) from the repository root in a child process and reports its
wall time against the 10-minute target; with ``--slow`` also ``-m slow`` (part of the whole CI run,
whose target is 30 minutes with the docs build). A failing suite fails the row: a fast suite that
does not pass proves nothing. There is no baseline to interleave with: the baseline column is the
target itself, so the ratio is the share of the budget used.

``benchmarks/run_all.py`` runs this only when asked (``--suite``): it takes minutes, and every other
benchmark is about the engine, not the tests.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _measure import print_table, row  # noqa: E402

ROOT = HERE.parent
TIERS = {
    "default": ([], 600.0),  # pyproject's addopts already deselect the slow tier
    "slow": (["-m", "slow"], 1800.0),
}


def _time_tier(tier: str) -> dict[str, Any]:
    extra, budget = TIERS[tier]
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:randomly", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    return row(
        f"test suite wall time, {tier} tier (pytest -n 2)",
        wall,
        budget,
        unit="s (baseline: the budget)",
        target=f"<= {budget / 60:.0f} min",
        ok=proc.returncode == 0 and wall <= budget,
        summary=summary,
    )


def run(quick: bool = False, slow: bool = False) -> list[dict[str, Any]]:
    """The default tier always; the slow tier with ``slow`` (``quick`` changes nothing here)."""
    return [_time_tier("default")] + ([_time_tier("slow")] if slow else [])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", action="store_true", help="also time the slow tier")
    results = run(slow=parser.parse_args().slow)
    print_table(results)
    for r in results:
        print(f"  {r['measure']}: {r['summary']}")
