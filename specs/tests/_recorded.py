"""The rows of the last recorded benchmark run (``benchmarks/results.json``, written by run_all).

Throughput targets are never timed in a test (the box is shared and noisy); an owed item for one
reads the committed run instead, so it turns green when a recorded run meets the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results.json"


def recorded_rows(benchmark: str) -> list[dict[str, Any]]:
    """The rows ``benchmark`` (a module of ``benchmarks/``) wrote in the recorded run; [] if none."""
    if not RESULTS.is_file():
        return []
    rows = json.loads(RESULTS.read_text(encoding="utf-8"))["rows"]
    return [r for r in rows if r.get("benchmark") == benchmark]
