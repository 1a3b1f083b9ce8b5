"""The engine loop: an Engine built from one EngineConfig drives scheduler and runner alone."""

from __future__ import annotations

import dataclasses

import pytest

from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, Engine, EngineConfig, EngineStats, SamplingParams
from tokenstate.runtime.scheduler import Request

PROMPTS = [(5, 6, 7), (9, 3), (11, 12, 13, 14)]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_an_engine_from_a_config_serves_what_llm_serves(async_scheduling):
    factory = toy_factory()
    config = EngineConfig(async_scheduling=async_scheduling, max_num_seqs=2, max_num_batched_tokens=4)
    stats = EngineStats()
    engine = Engine(factory, factory.build_preset(next(iter(factory.presets))), config, stats)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    requests = [Request(i, p, params, seed=i, eos_token_ids=()) for i, p in enumerate(PROMPTS)]
    for req in requests:
        engine.add(req)
    finished = []
    while engine.has_unfinished:
        finished += engine.step()
    assert sorted(r.request_id for r in finished) == [0, 1, 2]
    expected = LLM(factory, async_scheduling=False, max_num_seqs=2).generate(
        [list(p) for p in PROMPTS], [dataclasses.replace(params, seed=i) for i in range(3)]
    )
    assert [tuple(r.output_token_ids) for r in requests] == [o.token_ids for o in expected]
    assert (stats.async_steps > 0) == async_scheduling and (stats.sync_steps > 0) != async_scheduling


def test_engine_config_is_one_frozen_list_of_settings():
    config = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_num_seqs = 3  # type: ignore[misc]
    llm = LLM(toy_factory(), max_num_seqs=3, seed=4)
    assert llm._engine.config.max_num_seqs == 3 and llm._engine.config.seed == 4
    assert llm._engine.scheduler.max_num_seqs == 3 and llm._engine.runner.table.ids.shape[0] == 3
