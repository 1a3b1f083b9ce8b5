"""Requests arriving over time, driven through an engine step by step (as a server would).

:func:`run_workload` is how tests and benchmarks replay one schedule — arrivals at given engine
steps — on several engines (sync and async, different row orders or budgets) and compare what every
request got. Steps are counted by the driver: an arrival at step ``s`` is added just before the
``s``-th call of :meth:`~tokenstate.runtime.LLM.step`, also when the engine is idle in between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenstate.contracts import ConfigError, TokenStateError
from tokenstate.runtime.llm import LLM
from tokenstate.runtime.outputs import RequestOutput
from tokenstate.runtime.params import SamplingParams

__all__ = ["Arrival", "run_workload"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request that arrives before engine step ``step``."""

    step: int
    prompt: tuple[int, ...]
    params: SamplingParams


def run_workload(
    llm: LLM,
    arrivals: Sequence[Arrival],
    *,
    max_steps: int = 100_000,
    after_step: Callable[[LLM], None] | None = None,
) -> list[RequestOutput]:
    """Replay ``arrivals`` on ``llm``; returns each arrival's output, in the order given.

    ``after_step(llm)`` runs after every engine step (the gate audits the engine's state there).

    Raises:
        ConfigError: the engine still has unfinished requests of its own.
        TokenStateError: a request was lost (never returned), returned twice, or the engine did not
            finish within ``max_steps`` steps (a scheduler livelock).
    """
    if llm.has_unfinished_requests():
        raise ConfigError(
            "run_workload: the engine has unfinished requests; start from an idle one."
        )
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].step)  # stable: ties keep order
    request_of: dict[int, int] = {}  # request_id -> arrival index
    outputs: dict[int, RequestOutput] = {}
    next_arrival = 0
    step = 0
    while next_arrival < len(order) or llm.has_unfinished_requests():
        while next_arrival < len(order) and arrivals[order[next_arrival]].step <= step:
            arrival = arrivals[order[next_arrival]]
            request_of[llm.add_request(arrival.prompt, arrival.params)] = order[next_arrival]
            next_arrival += 1
        for out in llm.step():
            index = request_of[out.request_id]
            if index in outputs:
                raise TokenStateError(f"run_workload: request {out.request_id} was returned twice.")
            outputs[index] = out
        if after_step is not None:
            after_step(llm)
        step += 1
        if step > max_steps:
            raise TokenStateError(
                f"run_workload: {len(arrivals) - len(outputs)} requests unfinished after {max_steps} "
                "steps; the scheduler is not making progress."
            )
    lost = sorted(set(range(len(arrivals))) - set(outputs))
    if lost:
        raise TokenStateError(f"run_workload: arrivals {lost} were never returned (lost requests).")
    return [outputs[i] for i in range(len(arrivals))]
