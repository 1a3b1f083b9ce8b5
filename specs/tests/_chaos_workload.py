"""The workload the stream-fence items run under chaos: many slot reuses, idle rows, penalties."""

from __future__ import annotations

from tokenstate.contracts import TokenStateError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams

FACTORY = toy_factory("ChaosToyLM", vocab_size=64, eos_token_id=None)
ENGINE = {"max_num_seqs": 4, "max_num_batched_tokens": 12}
NUM_REQUESTS = 48
"""Each request after the fourth reuses a slot: one more chance for a run to hit the reseed race
(STR-3). With 24 the reseed mutant escaped 2-4 % of chaos seeds on the worker thread, and two of
twenty in one CI run; with 48 it was caught in 100 of 100."""


def _requests() -> tuple[list[list[int]], list[SamplingParams]]:
    prompts, params = [], []
    for i in range(NUM_REQUESTS):
        prompts.append([(7 * i + 5 * j) % 60 + 1 for j in range(2 + (11 * i) % 17)])
        params.append(
            SamplingParams(
                max_tokens=6 + (5 * i) % 13,
                stop_token_ids=((3 * i) % 60 + 1, (5 * i) % 60 + 2),  # finishes nobody can foresee
                repetition_penalty=1.3 if i % 2 else 1.0,  # reads the device history
            )
        )
    return prompts, params


def reference() -> list[tuple[int, ...]]:
    """The synchronous engine's tokens, without chaos."""
    prompts, params = _requests()
    return [o.token_ids for o in LLM(FACTORY, async_scheduling=False, **ENGINE).generate(prompts, params)]


def diverges(chaos: int, expected: list[tuple[int, ...]], cpu_stream: str = "thread") -> str | None:
    """Run the async engine under ``chaos`` on ``cpu_stream`` (the worker thread or the device
    process); ``None`` if it matches, else what went wrong."""
    prompts, params = _requests()
    llm = LLM(FACTORY, async_scheduling=True, chaos=chaos, cpu_stream=cpu_stream, **ENGINE)
    try:
        got = [o.token_ids for o in llm.generate(prompts, params)]
    except (TokenStateError, RuntimeError, IndexError, ValueError) as exc:
        return f"chaos seed {chaos}: {type(exc).__name__}: {exc}"
    wrong = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    return f"chaos seed {chaos}: requests {wrong} diverge from sync" if wrong else None
