"""The Hypothesis schedule suite on the deferred CPU stream: async with ``cpu_stream="deferred"`` ==
sync, token for token, over random schedules. There every step's device work runs only when the
host waits past it — after the host has planned (and admitted, preempted, drafted for) the steps
that follow — the latest a device may legally run, on every schedule: host bookkeeping that a
device task changes behind the host's back, or a fence the host skips, shows as a wrong token
deterministically, where the threaded stream needs chaos to show it.
"""

from __future__ import annotations

import pytest

from .test_schedule_property import EXAMPLES, assert_reached, one_thread, run_property

__all__ = ["one_thread"]  # the module's autouse fixture, reused here

DEFERRED = {"cpu_stream": "deferred"}
# Schedules per model: (default tier, slow tier).
DEFERRED_EXAMPLES = {"tiny-llama": (20, 300), "toy": (20, 300), "tiny-nemotron-h": (15, 250), "tiny-kimi-linear": (15, 250)}


def _assert_ran_deferred(totals, examples: int) -> None:
    assert totals["schedules"] >= examples and totals["async_steps"] > 0
    assert totals["async_streams:DeferredStream"] == totals["schedules"], totals


@pytest.mark.parametrize("name", list(DEFERRED_EXAMPLES))
def test_the_deferred_stream_gives_the_synchronous_tokens_over_random_schedules(name):
    examples = DEFERRED_EXAMPLES[name][0]
    _assert_ran_deferred(run_property(name, examples, DEFERRED), examples)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEFERRED_EXAMPLES))
def test_the_deferred_stream_gives_the_synchronous_tokens_over_many_random_schedules(name):
    examples = DEFERRED_EXAMPLES[name][1]
    totals = run_property(name, examples, DEFERRED)
    _assert_ran_deferred(totals, examples)
    assert_reached(name, totals, examples)


assert set(DEFERRED_EXAMPLES) == set(EXAMPLES)  # every model of the suite, deferred too
