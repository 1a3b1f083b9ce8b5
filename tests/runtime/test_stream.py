"""The CPU stream: in-order tasks on a worker thread, real events, errors at the next fence, chaos."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest
import torch

from tokenstate.contracts import ConfigError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.stream import (
    CHAOS_ENV,
    CPU_STREAM_ENV,
    Chaos,
    CpuStream,
    DeferredStream,
    InlineStream,
    chaos_from_env,
    choose_cpu_stream,
    stream_for,
)

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_stream_var", default="unset")


def test_tasks_run_in_order_on_one_worker_thread_and_events_mark_progress():
    stream = CpuStream()
    gate = threading.Event()
    seen: list[tuple[int, str]] = []
    stream.submit(gate.wait)
    for i in range(3):
        stream.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    event = stream.record_event()
    assert not event.query()  # the worker is held at the gate: the event is not reached yet
    gate.set()
    event.synchronize()
    assert event.query()
    assert [i for i, _ in seen] == [0, 1, 2]
    assert {name for _, name in seen} == {"tokenstate-cpu-stream"}


def test_tasks_see_the_submitters_context_and_run_in_inference_mode():
    stream = CpuStream()
    seen: list[tuple[str, bool]] = []
    token = _VAR.set("from the host")
    try:
        stream.submit(lambda: seen.append((_VAR.get(), torch.is_inference_mode_enabled())))
    finally:
        _VAR.reset(token)
    stream.synchronize()
    assert seen == [("from the host", True)]


@pytest.mark.parametrize("make_stream", [CpuStream, InlineStream, DeferredStream], ids=["thread", "inline", "deferred"])
def test_a_failed_task_raises_at_the_next_fence_and_skips_later_tasks_until_reset(make_stream):
    stream = make_stream()
    ran: list[int] = []

    def fail() -> None:
        raise ValueError("device fault")

    stream.submit(fail)
    stream.submit(ran.append, 1)  # skipped: the stream is poisoned, as after a device error
    stream.record_event().wait()  # a buffer fence only waits: the error is the sync point's
    with pytest.raises(ValueError, match="device fault"):
        stream.synchronize()
    with pytest.raises(ValueError, match="device fault"):
        stream.record_event().synchronize()  # still failed: errors stay until reset
    stream.reset()
    stream.submit(ran.append, 2)
    stream.synchronize()
    assert ran == [2]


@pytest.mark.parametrize("make_stream", [CpuStream, InlineStream, DeferredStream], ids=["thread", "inline", "deferred"])
def test_an_event_recorded_before_a_failed_task_does_not_raise_its_error(make_stream):
    stream = make_stream()
    before = stream.record_event()

    def fail() -> None:
        raise ValueError("step N+1's fault")

    stream.submit(fail)
    after = stream.record_event()
    with pytest.raises(ValueError):
        after.synchronize()
    before.synchronize()  # step N's sync point does not report step N+1's fault
    stream.reset()


def test_the_inline_stream_runs_each_task_at_submit_in_the_host_thread():
    stream = InlineStream()
    seen: list[tuple[int, str, str, bool]] = []
    token = _VAR.set("from the host")
    try:
        for i in range(3):
            stream.submit(lambda i=i: seen.append(
                (i, threading.current_thread().name, _VAR.get(), torch.is_inference_mode_enabled())
            ))  # fmt: skip
            assert len(seen) == i + 1  # ran before submit returned
        stream.submit(_VAR.set, "set by a task")  # a task's context is a copy, as on the worker
    finally:
        _VAR.reset(token)
    assert _VAR.get() == "unset"
    host = threading.current_thread().name
    assert seen == [(i, host, "from the host", True) for i in range(3)]
    event = stream.record_event()
    assert event.query()  # nothing is ever behind: every event is passed when recorded
    event.synchronize()


def test_the_deferred_stream_runs_tasks_only_when_the_host_waits_past_them():
    """The latest a device may run its work: nothing runs at submit, a fence runs exactly the tasks
    submitted before its event (in order, in the host thread, in the submitter's context)."""
    stream = DeferredStream()
    seen: list[tuple[int, str, bool]] = []
    token = _VAR.set("from the host")
    try:
        for i in range(2):
            stream.submit(lambda i=i: seen.append((i, _VAR.get(), torch.is_inference_mode_enabled())))
    finally:
        _VAR.reset(token)
    first = stream.record_event()
    stream.submit(seen.append, (2, "later", False))
    second = stream.record_event()
    assert seen == [] and not first.query() and not second.query()  # submitting ran nothing
    first.wait()
    assert seen == [(0, "from the host", True), (1, "from the host", True)]  # not the later task
    assert first.query() and not second.query()
    second.synchronize()
    assert seen[-1] == (2, "later", False) and second.query()
    stream.submit(seen.append, "closing")
    stream.close()  # close runs what was submitted, as the worker's close does
    assert seen[-1] == "closing"


def test_stream_for_picks_the_cpu_stream_and_refuses_other_devices(monkeypatch):
    monkeypatch.delenv(CPU_STREAM_ENV, raising=False)
    assert isinstance(stream_for(torch.device("cpu")), InlineStream)  # the CPU default
    assert isinstance(stream_for(torch.device("cpu"), cpu_stream="thread"), CpuStream)
    assert isinstance(stream_for(torch.device("cpu"), Chaos(1)), CpuStream)  # chaos needs the worker
    assert isinstance(stream_for(torch.device("cpu"), cpu_stream="deferred"), DeferredStream)
    with pytest.raises(ConfigError, match="no stream for device meta"):
        stream_for(torch.device("meta"))


def test_chaos_is_seeded_and_its_settings_are_checked(monkeypatch):
    a, b = Chaos(5), Chaos(5)
    assert [a.stream_delay() for _ in range(20)] == [b.stream_delay() for _ in range(20)]
    assert any(d > 0 for d in (a.stream_delay() for _ in range(20)))
    with pytest.raises(ConfigError, match="int >= 0"):
        Chaos(-1)
    with pytest.raises(ConfigError, match="probability"):
        Chaos(1, probability=2.0)
    monkeypatch.setenv(CHAOS_ENV, "7")
    chaos = chaos_from_env()
    assert chaos is not None and chaos.seed == 7
    monkeypatch.setenv(CHAOS_ENV, "fast")
    with pytest.raises(ConfigError, match=r"TOKENSTATE_CHAOS='fast' is not a seed"):
        chaos_from_env()
    monkeypatch.delenv(CHAOS_ENV)
    assert chaos_from_env() is None


def test_llm_chaos_option_keeps_async_equal_to_sync():
    prompts = [[5, 6, 7], [9, 3, 4, 1], [11, 12]]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    sync = LLM(toy_factory(), async_scheduling=False).generate(prompts, params)
    llm = LLM(toy_factory(), chaos=3, max_num_seqs=2)
    assert llm._engine.runner.chaos is not None and llm._engine.runner.chaos.seed == 3
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in sync]


def test_the_cpu_stream_choice_option_env_and_chaos(monkeypatch):
    monkeypatch.delenv(CPU_STREAM_ENV, raising=False)
    assert choose_cpu_stream(None, None) == "inline"
    assert choose_cpu_stream(None, Chaos(2)) == "thread"
    assert choose_cpu_stream("thread", None) == "thread"
    monkeypatch.setenv(CPU_STREAM_ENV, "thread")
    assert choose_cpu_stream(None, None) == "thread"
    assert choose_cpu_stream("inline", None) == "inline"  # the option wins over the environment
    monkeypatch.setenv(CPU_STREAM_ENV, "inline")
    with pytest.raises(ConfigError, match="chaos needs the threaded CPU stream"):
        choose_cpu_stream(None, Chaos(2))
    with pytest.raises(ConfigError, match="chaos needs the threaded CPU stream"):
        choose_cpu_stream("deferred", Chaos(2))  # deferred is one fixed order: nothing to perturb
    monkeypatch.setenv(CPU_STREAM_ENV, "gpu")
    with pytest.raises(ConfigError, match=r"TOKENSTATE_CPU_STREAM='gpu' is not a CPU stream; valid values: inline, thread, process, deferred"):
        choose_cpu_stream(None, None)
    monkeypatch.setenv(CPU_STREAM_ENV, " Thread ")  # read like every string setting
    assert choose_cpu_stream(None, None) == "thread"
    with pytest.raises(ConfigError, match="cpu_stream must be one of"):
        choose_cpu_stream("fast", None)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_llm_gives_the_same_tokens_on_either_cpu_stream(async_scheduling, monkeypatch):
    monkeypatch.delenv(CPU_STREAM_ENV, raising=False)
    prompts = [[5, 6, 7], [9, 3, 4, 1], [11, 12], [2, 8, 8, 8, 8, 8]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = {}
    kinds = {"inline": InlineStream, "thread": CpuStream, "deferred": DeferredStream}
    for kind, expected in kinds.items():
        llm = LLM(toy_factory(), async_scheduling=async_scheduling, max_num_seqs=2, cpu_stream=kind)
        assert isinstance(llm._engine.runner.stream, expected)
        outputs[kind] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outputs["inline"] == outputs["thread"] == outputs["deferred"]
    assert isinstance(LLM(toy_factory())._engine.runner.stream, InlineStream)  # the default
    with pytest.raises(ConfigError, match="chaos needs the threaded CPU stream"):
        LLM(toy_factory(), chaos=1, cpu_stream="inline")


def test_a_dropped_engine_stops_its_worker_thread() -> None:
    import gc
    import weakref

    earlier = set(threading.enumerate())
    llm = LLM(toy_factory(), cpu_stream="thread")
    llm.generate([[3, 4, 5]], SamplingParams(max_tokens=3))
    stream = weakref.ref(llm._engine.runner.stream)
    (worker,) = [t for t in set(threading.enumerate()) - earlier if t.name == "tokenstate-cpu-stream"]
    del llm
    gc.collect()  # the runner and its stream reference each other
    # The worker's last task (a bound method of the runner) must not keep the stream alive: a test
    # suite making hundreds of engines had thousands of idle worker threads.
    assert stream() is None
    assert not worker.is_alive()  # stopped and joined by the stream's finalizer


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_refused_the_worker_it_does_not_have() -> None:
    """A process forked from the host inherits the stream but not its worker thread: a task it
    submitted would wait forever, so it is refused with what to do instead."""
    stream = CpuStream()
    stream.synchronize()
    pid = os.fork()
    if pid == 0:  # the child: report through its exit status, never return into pytest
        code = 1
        try:
            try:
                stream.submit(lambda: None)
                code = 2
            except ConfigError as refused:
                code = 0 if "forked" in str(refused) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stream.submit(lambda: None)
    stream.synchronize()  # the host's worker still serves the host
    stream.close()



def test_a_closed_streams_finalizer_never_stops_a_later_streams_worker():
    """Closing one engine and starting the next, then collecting the first: its finalizer must stop
    its own worker only. Keyed by the worker thread's id(), a new worker born at the freed address
    of an old one shared its key, and the old stream's finalizer stopped it ("CPU stream: closed"
    in a fresh LLM, seen in CI). Keys are never reused."""
    import gc

    keys, held = [], []
    for _ in range(30):
        stream = CpuStream()
        keys.append(stream._key)
        stream.close()
        held.append(stream)
        if len(held) > 1:
            held.pop(0)  # the earlier stream's finalizer runs while a later one is alive
            gc.collect()
        assert stream._key not in keys[:-1]
    assert len(set(keys)) == len(keys)
