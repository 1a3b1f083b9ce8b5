"""The KV caches on transparent huge pages vs on plain pages: tokens/s, side by side in one process.

Run: ``python benchmarks/kv_huge_pages.py [--model tiny|big] [--workload A|B] [--rounds N]``. Two
engines over the peer benchmark's model and workload (:mod:`engine_vs_peers`, same weights), one
with the caches :func:`~tokenstate.models.layers.allocate_kv_cache` makes on a CPU (advised onto
huge pages), one with the caches made by ``torch.zeros``; the rounds alternate which runs first.
Prints each round's tokens/s and ratio, then the median and spread. A report, not a target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engine_vs_peers import MAX_NUM_BATCHED_TOKENS, MODELS, WORKLOADS, _save, workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="tiny")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="B")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    import torch

    from tokenstate.models import layers
    from tokenstate.models.cpu_memory import huge_page_backing
    from tokenstate.runtime import LLM, SamplingParams

    torch.set_num_threads(1)
    prompts, max_tokens = workload(args.workload, MODELS[args.model]["vocab_size"])
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    with tempfile.TemporaryDirectory(prefix="kv_huge_pages_") as tmp:
        path = _save(args.model, Path(tmp))

        def engine() -> LLM:
            return LLM(path, async_scheduling=True, max_num_seqs=len(prompts), max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)

        huge = engine()
        advised = layers.allocate_kv_cache
        layers.allocate_kv_cache = lambda *shape, like: torch.zeros(*shape, dtype=like.dtype)
        try:
            plain = engine()
        finally:
            layers.allocate_kv_cache = advised
    def tokens_per_s(llm: LLM) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        return sum(max_tokens) / (time.perf_counter() - start), [o.token_ids for o in outs]

    _, expected = tokens_per_s(plain)
    _, got = tokens_per_s(huge)  # warm-up both; the caches' pages are faulted in here
    assert got == expected, "the two engines disagree on tokens"
    cache = huge.model.model.layers[0].self_attn.k_cache
    print(f"huge-page engine's first K cache after a run: {huge_page_backing(cache)}")
    ratios = []
    for r in range(args.rounds):
        order = (huge, plain) if r % 2 else (plain, huge)
        speed = {id(llm): tokens_per_s(llm)[0] for llm in order}
        ratios.append(speed[id(huge)] / speed[id(plain)])
        print(f"round {r}: plain {speed[id(plain)]:.0f}  huge pages {speed[id(huge)]:.0f} tokens/s  ratio {ratios[-1]:.3f}")
    print(f"huge / plain: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
