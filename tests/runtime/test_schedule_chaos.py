"""The Hypothesis schedule suite under chaos: async == sync == oracle with the stream and the host
paused at random (a fresh chaos seed for every engine), so every interleaving of host preparation
and device work is exercised — and no schedule may diverge.
"""

from __future__ import annotations

import pytest

from ._schedule_cases import chaos_for_every_engine
from .test_schedule_property import EXAMPLES, assert_reached, one_thread, run_property

__all__ = ["one_thread"]  # the module's autouse fixture, reused here

CHAOS_EXAMPLES = {"tiny-llama": 15, "toy": 20, "tiny-nemotron-h": 10, "tiny-kimi-linear": 10}


@pytest.fixture(autouse=True)
def chaos_per_engine(monkeypatch):
    chaos_for_every_engine(monkeypatch, 1000)


@pytest.mark.parametrize("name", list(CHAOS_EXAMPLES))
def test_no_schedule_diverges_under_chaos(name):
    # A short run: each schedule's own asserts are the check (the rarer conditions, preemption
    # say, are only demanded of the slow tier's full suite below).
    totals = run_property(name, CHAOS_EXAMPLES[name])
    assert totals["schedules"] >= CHAOS_EXAMPLES[name] and totals["async_steps"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_no_schedule_of_the_whole_suite_diverges_under_chaos(name):
    examples = EXAMPLES[name][1]
    assert_reached(name, run_property(name, examples), examples)
