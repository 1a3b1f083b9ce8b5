"""Shared measuring helpers: interleaved repetitions, median and min–max, one table format."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(
    contenders: dict[str, Callable[[], Any]], *, repeats: int, inner: int, warmup: int = 2
) -> dict[str, dict[str, float]]:
    """Time each contender ``repeats`` times, alternating between them every repetition.

    Interleaving makes slow drifts of the machine (other processes, frequency changes) hit every
    contender alike, so the ratios stay meaningful on a shared 2-core box. Each sample is the mean
    of ``inner`` calls, in microseconds.
    """
    for _ in range(warmup):
        for fn in contenders.values():
            for _ in range(inner):
                fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner * 1e6)
    return {
        name: {"median": statistics.median(s), "min": min(s), "max": max(s)} for name, s in samples.items()
    }


def row(measure: str, ours: float, baseline: float, *, unit: str, target: str, ok: bool, **extra: Any) -> dict[str, Any]:
    """One result row, the format every benchmark's ``run()`` returns."""
    ratio = ours / baseline if baseline else float("nan")
    return {
        "measure": measure,
        "ours": round(ours, 3),
        "baseline": round(baseline, 3),
        "ratio": round(ratio, 4),
        "unit": unit,
        "target": target,
        "pass": bool(ok),
        **extra,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'measure':<48} {'ours':>12} {'baseline':>12} {'ratio':>8}  {'target':<14} result"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['measure']:<48} {r['ours']:>12.3f} {r['baseline']:>12.3f} {r['ratio']:>8.4f}  "
            f"{r['target']:<14} {'PASS' if r['pass'] else 'FAIL'}  ({r['unit']})"
        )
