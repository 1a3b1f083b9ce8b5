"""Every scheduling feature of the engine on one small model, async == sync throughout.

Executed by tests/docs/test_scheduling_tour.py; the page docs/concepts/scheduling.md shows it.
"""

from __future__ import annotations

from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.workload import Arrival, run_workload

# --8<-- [start:engines]
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 3], [11, 12, 13, 14, 15, 16, 17, 18, 19], [4], [8, 8, 9, 8]]


def engine(async_scheduling: bool) -> LLM:
    return LLM(
        toy_factory(),
        async_scheduling=async_scheduling,
        max_num_seqs=3,  # fewer slots than requests: slots get reused
        max_num_batched_tokens=6,  # smaller than a prompt: chunked prefill and budget skips
        kv_cache_tokens=30,  # a tight KV budget: preemption with recompute
        scheduling_order="random",  # rows permuted every step (seeded)
        speculative={"method": "ngram", "num_tokens": 2},  # prompt-lookup drafts, greedy verification
    )
# --8<-- [end:engines]


# --8<-- [start:sampling]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
PENALISED = SamplingParams(
    max_tokens=10, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5, bad_words=((59,), (78, 39))
)
# --8<-- [end:sampling]


def tour() -> dict[str, object]:
    results = {}
    for async_scheduling in (False, True):
        llm = engine(async_scheduling)
        # --8<-- [start:generate]
        outputs = llm.generate(PROMPTS, [GREEDY, PENALISED, GREEDY, PENALISED, GREEDY])
        # --8<-- [end:generate]
        results[async_scheduling] = ([o.token_ids for o in outputs], llm.stats)
    # --8<-- [start:arrivals]
    llm = engine(async_scheduling=True)
    arrivals = [Arrival(step=0, prompt=(5, 6, 7), params=GREEDY), Arrival(step=4, prompt=(9, 3), params=PENALISED)]
    streamed = run_workload(llm, arrivals)  # add_request / step until every request is back
    # --8<-- [end:arrivals]
    return {"sync": results[False], "async": results[True], "streamed": streamed}
