"""Random schedules for the async == sync == oracle property, and the checks every run must pass.

A schedule is a list of arrivals (engine step, prompt, sampling parameters) plus engine limits:
slots, a token budget that forces chunked prefill and budget skips, a KV budget small enough to
force preemption, the row order, and speculative decoding. Prompts draw from a small alphabet so
that stop ids, bad words and n-gram drafts actually fire.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

from tokenstate.contracts import PLACEHOLDER
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams, llm as llm_module, resolve
from tokenstate.runtime.registry import ModelFactory
from tokenstate.runtime.stream import Chaos
from tokenstate.runtime.workload import Arrival, run_workload

ALPHABET = st.integers(3, 14)  # small: repeats, stop ids and bad words that match
COUNTERS = (
    "preemptions", "reordered_steps", "skipped_rows", "drafts_accepted", "drafts_rejected",
    "discarded_tokens", "async_steps",
)  # fmt: skip


def chaos_for_every_engine(monkeypatch: Any, first_seed: int) -> None:
    """Give every engine made from here on chaos mode with a fresh seed (``first_seed``, then on)."""
    seeds = itertools.count(first_seed)
    monkeypatch.setattr(llm_module, "chaos_from_env", lambda: Chaos(next(seeds)))


@cache
def cached_model(name: str, instance: str = "shared") -> tuple[ModelFactory, Any]:
    """The named model built once per process (per ``instance``), and a factory whose build returns it.

    Engines run one after the other and each allocates its slots afresh, so sharing the weights is
    safe; building is the slow part of a tiny engine. An engine that changes its model for good
    (``compile=True`` compiles it in place) takes an instance of its own, with the same weights.
    """
    factory = toy_factory("ScheduleToy", eos_token_id=2) if name == "toy" else resolve(name)
    model = factory.build_preset(next(iter(factory.presets)), device="cpu")
    return dataclasses.replace(factory, build=lambda config, *, device, seed: model), model


@cache
def cached_oracle(name: str) -> Any:
    from tokenstate.tools.oracle import HFOracle

    return HFOracle(*cached_model(name))


@dataclass(frozen=True)
class Schedule:
    arrivals: tuple[Arrival, ...]
    max_num_seqs: int
    budget: int
    kv_extra: int | None  # KV budget = the longest request + this; None: no KV limit
    order: str
    num_drafts: int  # 0: speculative decoding off
    check_oracle: bool

    def engine_args(self, max_model_len: int) -> dict:
        args = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.budget,
            "scheduling_order": self.order,
            "seed": 7,
        }
        if self.kv_extra is not None:
            longest = max(
                min(len(a.prompt) + a.params.max_tokens, max_model_len) for a in self.arrivals
            )
            args["kv_cache_tokens"] = longest + self.kv_extra
        if self.num_drafts:
            args["speculative"] = {"method": "ngram", "num_tokens": self.num_drafts}
        return args


@st.composite
def sampling_params(draw) -> SamplingParams:
    kw = {
        "max_tokens": draw(st.integers(1, 10)),
        "stop_token_ids": tuple(draw(st.lists(ALPHABET, max_size=2))),
        "ignore_eos": draw(st.booleans()),
    }
    if draw(st.integers(0, 3)) == 0:
        kw |= {"temperature": draw(st.sampled_from([0.6, 1.2])), "seed": draw(st.integers(0, 99))}
        kw["top_k"] = draw(st.sampled_from([0, 3]))
    if draw(st.integers(0, 2)) == 0:
        kw["repetition_penalty"] = draw(st.sampled_from([1.0, 1.4, 0.7]))
        kw["presence_penalty"] = draw(st.sampled_from([0.0, 0.6, -0.4]))
        kw["frequency_penalty"] = draw(st.sampled_from([0.0, 0.5]))
        words = st.lists(ALPHABET, min_size=1, max_size=3).map(tuple)
        kw["bad_words"] = tuple(draw(st.lists(words, max_size=3)))
    return SamplingParams(**kw)


@st.composite
def schedules(draw, *, speculative: bool) -> Schedule:
    arrivals = draw(
        st.lists(
            st.builds(
                Arrival,
                step=st.integers(0, 8),
                prompt=st.lists(ALPHABET, min_size=1, max_size=24).map(tuple),
                params=sampling_params(),
            ),
            min_size=1,
            max_size=6,
        )
    )
    return Schedule(
        arrivals=tuple(arrivals),
        max_num_seqs=draw(st.integers(1, 4)),
        budget=draw(st.integers(1, 24)),
        kv_extra=draw(st.none() | st.integers(0, 12)),
        order=draw(st.sampled_from(["random", "decode_first"])),
        num_drafts=draw(st.integers(0, 3)) if speculative else 0,
        check_oracle=draw(st.integers(0, 9)) == 0,  # the oracle is slow: a tenth of the runs
    )


def run_schedule(
    name: str, schedule: Schedule, async_options: dict[str, Any] | None = None, async_instance: str = "shared"
) -> Counter:
    """Run ``schedule`` on a sync and an async engine; assert every promise; return the counters.

    ``async_options``: further ``LLM`` options of the async engine only (``cpu_stream="process"``,
    say), which runs the model instance ``async_instance`` (:func:`cached_model`); the counter
    ``async_streams:<stream class>`` says where its device work ran.
    """
    factory, model = cached_model(name)
    vocab = model.vocab_size
    stats: Counter = Counter()
    outputs = {}
    for async_scheduling in (False, True):
        args = schedule.engine_args(model.max_model_len)
        engine_factory = factory
        if async_scheduling:
            args |= async_options or {}
            engine_factory = cached_model(name, async_instance)[0]
        llm = LLM(engine_factory, async_scheduling=async_scheduling, **args)
        outputs[async_scheduling] = run_workload(llm, schedule.arrivals)
        if async_scheduling:
            stats[f"async_streams:{type(llm._engine.runner.stream).__name__}"] += 1
        stats.update({k: v for k, v in llm.stats.as_dict().items() if k in COUNTERS})
    sync, async_ = outputs[False], outputs[True]
    for arrival, s, a in zip(schedule.arrivals, sync, async_, strict=True):
        assert a.token_ids == s.token_ids, f"async {a.token_ids} != sync {s.token_ids}"
        assert a.finish_reason == s.finish_reason
        assert 1 <= len(a.token_ids) <= arrival.params.max_tokens
        assert all(0 <= t < vocab and t != PLACEHOLDER for t in a.token_ids)
        single = {w[0] for w in arrival.params.bad_words if len(w) == 1}
        assert not single.intersection(a.token_ids), "a banned token was generated"
    if schedule.check_oracle and name != "toy":  # the toy model has no HF twin
        oracle = cached_oracle(name)
        for arrival, out in zip(schedule.arrivals, sync, strict=True):
            if arrival.params.greedy and not arrival.params.reads_history:
                choices = oracle.greedy_choices(list(arrival.prompt), list(out.token_ids))
                assert choices == list(out.token_ids), "the engine left HF's greedy path"
                stats["oracle_requests"] += 1
    return stats

