"""The serving API (add_request / step / has_unfinished_requests) and the new engine settings."""

from __future__ import annotations

import numpy as np
import pytest

from tokenstate.contracts import ConfigError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.workload import Arrival, run_workload


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_requests_added_between_steps_match_generate(async_scheduling):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    expected = LLM(toy_factory()).generate([[1, 2, 3], [4, 5]], params)
    llm = LLM(toy_factory(), async_scheduling=async_scheduling)
    first = llm.add_request([1, 2, 3], params)
    outputs = llm.step()
    second = llm.add_request([4, 5], params)
    while llm.has_unfinished_requests():
        outputs += llm.step()
    assert (first, second) == (0, 1) and llm.step() == []
    by_id = {o.request_id: o.token_ids for o in outputs}
    assert [by_id[0], by_id[1]] == [o.token_ids for o in expected]
    assert llm.stats.finished_requests == 2


def test_generate_refuses_while_added_requests_are_unfinished():
    llm = LLM(toy_factory())
    llm.add_request([1, 2])
    with pytest.raises(ConfigError, match="drive them to the end with step"):
        llm.generate([[3]])


def test_workload_arrivals_are_returned_in_order_and_never_lost():
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    arrivals = [Arrival(4, (1,), params), Arrival(0, (2, 3), params), Arrival(30, (4,), params)]
    outputs = run_workload(LLM(toy_factory(), max_num_seqs=1), arrivals)
    assert [o.prompt_token_ids for o in outputs] == [(1,), (2, 3), (4,)]
    assert all(len(o.token_ids) == 3 for o in outputs)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"scheduling_order": "fifo"}, "scheduling_order='fifo' is not an order; valid: decode_first, random"),
        ({"kv_cache_tokens": 0}, "kv_cache_tokens must be a positive int"),
        # slots and step tokens are int32 on the device
        ({"max_num_seqs": 2**63}, r"max_num_seqs must be a positive int below 2\*\*31, got 9223372036854775808"),
        ({"max_num_batched_tokens": 2**31}, r"max_num_batched_tokens must be a positive int below 2\*\*31"),
        ({"speculative": {"method": "eagle", "num_tokens": 2}}, "method 'eagle' is not available"),
        ({"speculative": {"method": "ngram", "num_tokens": 0}}, r"num_tokens must be an int in \[1, 15\]"),
        ({"speculative": {"method": "ngram", "num_tokens": 2, "k": 1}}, r"unknown keys \['k'\]"),
    ],
)
def test_bad_engine_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        LLM(toy_factory(), **kw)


def test_numpy_integers_are_ints_in_engine_settings():
    llm = LLM(toy_factory(), max_num_seqs=np.int64(3), max_num_batched_tokens=np.int32(16))
    assert llm.generate([[1, 2]], SamplingParams(max_tokens=2))[0].token_ids


def test_speculative_refused_by_name_for_a_model_that_cannot_roll_back():
    import dataclasses

    cannot = dataclasses.replace(toy_factory("NoRollback"), supports_speculative=False)
    with pytest.raises(ConfigError, match=r"model 'NoRollback' does not support speculative.*supports_speculative=False"):
        LLM(cannot, speculative={"method": "ngram", "num_tokens": 2})


def test_a_request_the_kv_budget_can_never_hold_is_refused():
    llm = LLM(toy_factory(), kv_cache_tokens=10)
    with pytest.raises(ConfigError, match=r"may reach 12 tokens.*kv_cache_tokens=10"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=10))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_observer_raising_in_step_loses_no_finished_request(async_scheduling):
    """A step observer (the CLI's progress bar) interrupted — Ctrl-C lands there — after the engine
    finished requests: the next step() returns them; nothing is silently dropped."""
    from tokenstate.runtime.progress import observe_steps

    llm = LLM(toy_factory(), async_scheduling=async_scheduling)
    first = llm.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    second = llm.add_request([4, 5], SamplingParams(max_tokens=2, ignore_eos=True))

    def interrupt(done):
        if done:
            raise KeyboardInterrupt

    got = []
    with observe_steps(interrupt):
        interrupted = 0
        while llm.has_unfinished_requests():
            try:
                got += llm.step()
            except KeyboardInterrupt:
                interrupted += 1
    assert interrupted >= 1
    assert sorted(o.request_id for o in got) == [first, second]
    assert all(len(o.token_ids) == 2 for o in got)
