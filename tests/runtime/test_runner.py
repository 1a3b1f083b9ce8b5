"""The runner's data flow: on the async path the host learns each step's tokens one step late."""

from __future__ import annotations

import importlib

import pytest

from tokenstate.contracts import PLACEHOLDER, checks_mode
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.input_prep import prepare_inputs
from tokenstate.runtime.scheduler import Request


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_host_learns_sampled_tokens_one_step_late_only_on_the_async_path(async_scheduling):
    llm = LLM(toy_factory(), async_scheduling=async_scheduling)
    engine = llm._engine
    request = Request(0, (5, 6, 7), SamplingParams(max_tokens=4), seed=0, eos_token_ids=())
    engine.add(request)
    known_after_step = []
    while engine.has_unfinished:
        engine.step()
        known_after_step.append(len(request.output_token_ids))
    if async_scheduling:
        # Step k's token is resolved only once step k + 1 has been launched; the last step that
        # runs is a bare resolve (nothing left to schedule).
        assert known_after_step == [0, 1, 2, 3, 4]
        assert llm.stats.async_steps == 4
    else:
        assert known_after_step == [1, 2, 3, 4]
    assert request.finish_reason == "length" and not engine.has_pending


def test_a_decode_row_is_prepared_before_the_host_knows_its_token():
    llm = LLM(toy_factory(), max_num_seqs=1)
    engine = llm._engine
    runner = engine.runner
    request = Request(0, (9, 8), SamplingParams(max_tokens=3), seed=0, eos_token_ids=())
    engine.add(request)
    engine.step()  # the prefill step: launched, its token still in flight
    batch = engine.scheduler.schedule()  # the decode row, prepared before that token resolved
    prepared = prepare_inputs(batch, runner.table, spliced=True)
    assert request.output_token_ids == []
    assert prepared.host_tokens.placeholder_buffer().tolist() == [PLACEHOLDER]
    runner.stream.synchronize()  # the device state is the stream's: read it once the stream is idle
    on_device = int(runner.mirror.last_sampled[request.slot])  # what combine will splice in
    engine._resolve_previous()
    assert request.output_token_ids == [on_device]


@pytest.mark.parametrize("mode", ["boundary", "full"])
def test_the_runner_validates_its_kernel_operands_in_full_checks_mode_only(mode, monkeypatch):
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    seen: dict[str, list[bool]] = {"combine": [], "post_update": []}

    def spy(name):
        original = getattr(runner_module, name)

        def recording(*args, validate, **kwargs):
            seen[name].append(validate)
            return original(*args, validate=validate, **kwargs)

        return recording

    for name in seen:
        monkeypatch.setattr(runner_module, name, spy(name))
    with checks_mode(mode):
        LLM(toy_factory()).generate([[5, 6, 7]], SamplingParams(max_tokens=3))
    assert seen["combine"] and seen["post_update"]
    assert set(seen["combine"]) == set(seen["post_update"]) == {mode == "full"}


def test_only_steps_with_a_sampled_row_gather_the_rows_sampling_parameters(monkeypatch):
    # The host decides per step what the device work needs (StepSampling): an all-greedy step
    # takes the argmax and gathers no temperature, top-k/top-p or seed, a mixed one gathers them.
    from tokenstate.runtime.runner import ModelRunner

    gathered: list[int] = []
    original = ModelRunner._sampling_rows

    def counting(self, sampling, dev):
        gathered.append(sampling.num_logits)
        return original(self, sampling, dev)

    monkeypatch.setattr(ModelRunner, "_sampling_rows", counting)
    llm = LLM(toy_factory(), max_num_seqs=2)
    greedy = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4))
    assert gathered == [] and all(len(o.token_ids) == 4 for o in greedy)
    llm.generate(
        [[5, 6, 7], [8, 9]],
        [SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, temperature=0.8, seed=1)],
    )
    assert gathered and all(n == 2 for n in gathered)
