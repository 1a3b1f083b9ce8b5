"""Property: over random workloads and engine limits, async == sync, token for token."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams

VOCAB = 128
FACTORIES = {
    (honors, eos): toy_factory(
        honors=honors, embed="device" if honors else "host", eos_token_id=eos
    )
    for honors in (True, False)
    for eos in (None, 3, 17)
}

prompt = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)
params = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 12),
    temperature=st.sampled_from([0.0, 0.7, 1.5]),
    top_k=st.sampled_from([0, 1, 5]),
    top_p=st.sampled_from([1.0, 0.6]),
    seed=st.none() | st.integers(0, 2**40),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=3).map(tuple),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=st.lists(st.tuples(prompt, params), min_size=1, max_size=7),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(1, 48),
    honors=st.booleans(),
    eos=st.sampled_from([None, 3, 17]),
)
def test_async_equals_sync_on_random_workloads(workload, max_num_seqs, budget, honors, eos):
    prompts = [p for p, _ in workload]
    sampling = [s for _, s in workload]
    factory = FACTORIES[(honors, eos)]
    results = {}
    for async_scheduling in (True, False):
        llm = LLM(
            factory,
            async_scheduling=async_scheduling,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
        )
        results[async_scheduling] = llm.generate(prompts, sampling)
    assert results[True] == results[False]
    for out, params in zip(results[True], sampling, strict=True):
        assert 1 <= len(out.token_ids) <= params.max_tokens
        assert all(0 <= t < VOCAB for t in out.token_ids)
        stops = {*params.stop_token_ids, *([] if eos is None else [eos])}
        assert not stops.intersection(out.token_ids[:-1])  # nothing generated past a stop
        assert (out.finish_reason == "stop") == (out.token_ids[-1] in stops)
