"""Where an engine step's time goes: op self-times by category, and the host time around them.

Run: ``python benchmarks/step_profile.py --model tiny|big --workload A|B [--requests N] [--compile]``.
Serves the peer benchmark's workload (:mod:`engine_vs_peers`, same model and weights) with
``LLM(async_scheduling=True)`` (``compile=True`` with ``--compile``; the compiled graph's own
loops then count as "other ops"), one thread: a warm-up run, then one run under ``torch.profiler``.
Every aten/oneDNN op's *self* time is put in one category; "host" is the run's wall time minus all
op time (scheduling, input preparation, Python around the ops). A report, not a target: the
profiler's own overhead inflates small ops, so compare shares, not seconds, and rerun on a quiet
machine.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engine_vs_peers import MAX_NUM_BATCHED_TOKENS, MODELS, WORKLOADS, workload  # noqa: E402

CATEGORIES = (
    ("linears", ("linear", "addmm", "aten::mm", "matmul")),
    ("attention", ("scaled_dot_product", "flash_attention", "softmax", "bmm")),
    ("KV cache gather / write", ("index_select", "index_put", "aten::index", "gather")),
)


def category(op: str) -> str:
    for name, keys in CATEGORIES:
        if any(k in op for k in keys):
            return name
    return "other ops"


def profile(model: str, load: str, requests: int | None, compile_layers: bool = False) -> list[tuple[str, float, float]]:
    """``(category, seconds, share of wall)`` rows, largest first, host last."""
    import torch
    from torch.profiler import profile as torch_profile

    from tokenstate.models.llama import build, save
    from tokenstate.runtime import LLM, SamplingParams

    torch.set_num_threads(1)
    prompts, max_tokens = workload(load, MODELS[model]["vocab_size"])
    prompts, max_tokens = prompts[:requests], max_tokens[:requests]
    with tempfile.TemporaryDirectory(prefix="step_profile_") as tmp:
        save(build(MODELS[model], seed=0), tmp)
        llm = LLM(
            tmp, async_scheduling=True, max_num_seqs=len(prompts),
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, compile=compile_layers,
        )  # fmt: skip
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    llm.generate(prompts, params)  # warm-up
    with torch_profile() as prof:
        start = time.perf_counter()
        llm.generate(prompts, params)
        wall = time.perf_counter() - start
    seconds: collections.Counter[str] = collections.Counter()
    for event in prof.key_averages():
        seconds[category(event.key)] += event.self_cpu_time_total / 1e6
    rows = [(name, s, s / wall) for name, s in seconds.most_common()]
    host = wall - sum(seconds.values())
    return [*rows, ("host (wall - ops)", host, host / wall), ("wall", wall, 1.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="tiny")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="B")
    parser.add_argument("--requests", type=int, default=None, help="first N requests of the workload")
    parser.add_argument("--compile", action="store_true", help="LLM(compile=True)")
    args = parser.parse_args()
    rows = profile(args.model, args.workload, args.requests, args.compile)
    label = f"{args.model} / {args.workload}{' (compiled)' if args.compile else ''}"
    print(f"| {label} | s | share |\n|---|---|---|")
    for name, s, share in rows:
        print(f"| {name} | {s:.3f} | {100 * share:.0f} % |")


if __name__ == "__main__":
    main()
