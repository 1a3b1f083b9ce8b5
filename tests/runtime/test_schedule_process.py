"""The Hypothesis schedule suite on the device process: async with ``cpu_stream="process"`` ==
sync, token for token, over random schedules (arrivals over time, chunked prefill, budget skips,
preemption, random row order, drafts, penalties, bad words), with and without chaos.

The device process holds its own copy of the model's slot state (KV caches, Mamba and KDA states)
and of the mirror, and every step's inputs cross a pipe: a task that read state the host changed
after the fork, or a step whose pickled plan lost a field, shows up here as a wrong token.
"""

from __future__ import annotations

import pytest

from tokenstate.runtime.process_stream import process_stream_available

from ._schedule_cases import chaos_for_every_engine
from .test_schedule_property import EXAMPLES, assert_reached, one_thread, run_property

__all__ = ["one_thread"]  # the module's autouse fixture, reused here

pytestmark = pytest.mark.skipif(not process_stream_available(), reason="the device process needs Linux")

ON_THE_DEVICE_PROCESS = {"cpu_stream": "process"}
# Schedules per model: (default tier, slow tier). Each async engine forks a device process.
PROCESS_EXAMPLES = {"tiny-llama": (20, 250), "toy": (20, 250), "tiny-nemotron-h": (15, 200), "tiny-kimi-linear": (15, 200)}


@pytest.fixture(params=[False, True], ids=["calm", "chaos"])
def chaos(request, monkeypatch) -> bool:
    """Under chaos every engine gets a fresh seed (the device process pauses before its tasks)."""
    if request.param:
        chaos_for_every_engine(monkeypatch, 2000)
    return request.param


def _assert_ran_on_the_device_process(totals, examples: int) -> None:
    assert totals["schedules"] >= examples and totals["async_steps"] > 0
    assert totals["async_streams:ProcessStream"] == totals["schedules"], totals


@pytest.mark.parametrize("name", list(PROCESS_EXAMPLES))
def test_the_device_process_gives_the_synchronous_tokens_over_random_schedules(name, chaos):
    examples = PROCESS_EXAMPLES[name][0]
    _assert_ran_on_the_device_process(run_property(name, examples, ON_THE_DEVICE_PROCESS), examples)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROCESS_EXAMPLES))
def test_the_device_process_gives_the_synchronous_tokens_over_many_random_schedules(name, chaos):
    examples = PROCESS_EXAMPLES[name][1]
    totals = run_property(name, examples, ON_THE_DEVICE_PROCESS)
    _assert_ran_on_the_device_process(totals, examples)
    assert_reached(name, totals, examples)


assert set(PROCESS_EXAMPLES) == set(EXAMPLES)  # every model of the suite, on the device process too
