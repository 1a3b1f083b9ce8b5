"""Wall time of the main job with the gate's schedule matrix vs without it (``--quick``).

Run: ``python benchmarks/main_job_time.py [--rounds 3]``. Each round runs ``tokenstate verify
--quick`` (the single baseline schedule the gate ran before the matrix) and ``tokenstate verify``
(baseline + matrix) as child processes of this one, alternating which goes first, and prints each
wall time and the min / median / max of the per-round ratios. The target: the matrix keeps the main
job under about twice its former time. Both runs must pass; a failing run fails the measurement.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERIFY = [sys.executable, "-m", "tokenstate", "verify"]


def _wall(extra: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*VERIFY, *extra], cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"verify {' '.join(extra)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ratios = []
    for r in range(args.rounds):
        order = (["--quick"], []) if r % 2 == 0 else ([], ["--quick"])
        times = {}
        for extra in order:
            times["quick" if extra else "full"] = _wall(extra)
        ratios.append(times["full"] / times["quick"])
        print(f"round {r + 1}: verify --quick {times['quick']:.1f} s, verify {times['full']:.1f} s, "
              f"ratio {ratios[-1]:.2f}", flush=True)  # fmt: skip
    print(f"ratio verify / verify --quick over {len(ratios)} rounds: min {min(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f} (target <= ~2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
