"""The Hypothesis schedule suite with the async engine compiled (``LLM(compile=True)``): its tokens
are the eager synchronous engine's over random schedules (chunked prefill, preemption, random row
order, drafts, penalties, bad words), calm on the inline stream and under chaos on the worker thread.

The compiled stack traces every step's token count as one dynamic size and reads each step's slot
runs from the step context (*Design notes → The decoder stack compiled*); a step whose structure
the graph baked in, or a stale context, shows up here as a wrong token.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from ._schedule_cases import chaos_for_every_engine
from .test_schedule_property import assert_reached, one_thread, run_property

__all__ = ["one_thread"]  # the module's autouse fixture, reused here

COMPILED = {"compile": True}
EXAMPLES = (25, 300)  # (default tier, slow tier), tiny-llama: the dense reference model compiles


@pytest.fixture(params=["inline", "thread-chaos"])
def stream(request, monkeypatch) -> str:
    if request.param == "thread-chaos":
        chaos_for_every_engine(monkeypatch, 3000)
    return request.param


def _run(examples: int) -> dict:
    # A model instance of its own: compiling changes the model in place, for every later engine.
    totals = run_property("tiny-llama", examples, COMPILED, async_instance="compiled")
    assert totals["schedules"] >= examples and totals["async_steps"] > 0
    return totals


def test_the_compiled_async_engine_gives_the_eager_tokens_over_random_schedules(stream):
    torch._dynamo.reset()  # forget graphs compiled before: this run must compile its own
    graphs = counters["stats"]["unique_graphs"]
    totals = _run(EXAMPLES[0])
    expected = "InlineStream" if stream == "inline" else "CpuStream"
    assert totals[f"async_streams:{expected}"] == totals["schedules"], totals
    assert counters["stats"]["unique_graphs"] - graphs == 1  # it compiled, once for every schedule


@pytest.mark.slow
def test_the_compiled_async_engine_gives_the_eager_tokens_over_many_random_schedules(stream):
    assert_reached("tiny-llama", _run(EXAMPLES[1]), EXAMPLES[1])
