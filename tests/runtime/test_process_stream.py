"""The device process: tasks forked off to another process, shared host buffers, events, errors."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tokenstate.contracts import ConfigError, StaleHostTokensError, TokenStateError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams, process_stream
from tokenstate.runtime.kernels import EmbeddedBadIdsError
from tokenstate.runtime.process_stream import ProcessStream, process_stream_available
from tokenstate.runtime.stream import stream_for

pytestmark = pytest.mark.skipif(not process_stream_available(), reason="the device process needs Linux")


class _DeviceState:
    """Stands for the runner's device-side objects: a tensor the device process owns."""

    def __init__(self) -> None:
        self.log = torch.zeros(8, dtype=torch.int64)  # [8]
        self.count = 0

    def append(self, value: int) -> None:
        self.log[self.count] = value
        self.count += 1


def _write_pid(dst: torch.Tensor) -> None:
    dst.fill_(os.getpid())


def _fill(dst: torch.Tensor, value: int) -> None:
    dst.fill_(value)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


def _fail(message: str) -> None:
    raise ValueError(message)


def _fail_unpicklably() -> None:
    class LocalError(Exception):  # defined here: the host cannot unpickle it
        pass

    raise LocalError("a device-only error type")


@pytest.fixture(params=["spin", "block"])
def started(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[ProcessStream, _DeviceState, torch.Tensor]:
    monkeypatch.setenv(process_stream.HOST_WAIT_ENV, request.param)  # every fence, either way of waiting
    stream = ProcessStream()
    host = stream.host_buffer(8, torch.int64)  # [8]: both processes map it
    state = _DeviceState()
    stream.start([state])
    yield stream, state, host
    stream.close()


def test_tasks_run_in_order_in_the_device_process_on_its_own_copy_of_the_state(started) -> None:
    stream, state, host = started
    stream.submit(_write_pid, host[:1])
    for value in (5, 6, 7):
        stream.submit(state.append, value)  # a bound method of a start() object: the device's copy
    stream.submit(_copy, host[1:4], state.log[:3])  # a view of a device buffer, into a shared one
    stream.synchronize()
    assert host[0].item() not in (0, os.getpid())  # ran in another process
    assert host[1:4].tolist() == [5, 6, 7]  # in submission order
    assert state.count == 0 and not state.log.any()  # the host's copy is untouched


def test_an_event_is_passed_only_once_every_task_before_it_ran(started) -> None:
    stream, _, host = started
    stream.submit(time.sleep, 0.3)
    stream.submit(_fill, host[:1], 9)
    event = stream.record_event()
    assert not event.query() and host[0].item() == 0
    event.synchronize()
    assert event.query() and host[0].item() == 9


def test_a_failed_task_raises_at_the_next_fence_and_skips_later_tasks_until_reset(started) -> None:
    stream, _, host = started
    before = stream.record_event()
    stream.submit(_fail, "device fault")
    stream.submit(_fill, host[:1], 1)  # skipped: the stream is poisoned
    stream.record_event().wait()  # a buffer fence only waits
    before.synchronize()  # step N's sync point does not report step N+1's fault
    with pytest.raises(ValueError, match="device fault") as raised:
        stream.synchronize()
    assert any("raised in the device process" in note for note in raised.value.__notes__)
    with pytest.raises(ValueError, match="device fault"):
        stream.synchronize()  # errors stay until reset
    stream.reset()
    stream.submit(_fill, host[:1], 2)
    stream.synchronize()
    assert host[0].item() == 2


def test_an_error_the_host_cannot_unpickle_arrives_as_its_text(started) -> None:
    stream, _, _ = started
    stream.submit(_fail_unpicklably)
    with pytest.raises(TokenStateError, match="LocalError: a device-only error type"):
        stream.synchronize()


def test_buffers_made_after_the_fork_reach_the_device(started) -> None:
    stream, state, _ = started
    host = stream.host_buffer(4, torch.int32)  # announced to the device process, opened there
    device = stream.device_buffer(state, "grown", 4, torch.int32)  # allocated on both sides
    stream.submit(_fill, device[1:3], 7)
    stream.submit(_copy, host, device)
    stream.synchronize()
    assert host.tolist()[1:3] == [7, 7]


def test_close_stops_the_device_process_and_a_closed_stream_says_so() -> None:
    stream = ProcessStream()
    stream.start([])
    pid = stream._link.pid
    stream.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # already reaped
    with pytest.raises(TokenStateError, match="process stream: closed"):
        stream.submit(_fill, torch.zeros(1), 1)
    stream.close()  # idempotent


def test_closing_while_the_device_answers_an_event_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    """A device process still running when its host closes the stream finds the reply pipe closed
    when it answers an event: the host is gone, so it stops quietly (no traceback on stderr)."""
    stream = ProcessStream()
    stream.start([])
    stream.submit(time.sleep, 0.2)
    assert not stream.record_event().query()  # sent; answered after the sleep, to a closed pipe
    stream.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_forked_child_neither_stops_nor_uses_its_parents_device_process() -> None:
    """A process forked from the host (a worker of the user's) inherits the stream: at its exit
    (``atexit``, the finalizer) it must not stop the parent's device process, and a task it submits
    is refused, not written into the parent's pipe between the parent's own tasks."""
    stream = ProcessStream()
    host = stream.host_buffer(1, torch.int64)  # [1]
    stream.start([])
    pid = os.fork()
    if pid == 0:  # the child: report through its exit status, never return into pytest
        code = 1
        try:
            try:
                stream.submit(_fill, host, 1)
                code = 2
            except ConfigError as refused:
                code = 0 if "forked" in str(refused) else 3
            process_stream._stop_all()  # what the child's atexit runs
            stream.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stream.submit(_fill, host, 3)
    stream.synchronize()  # the parent's device process still runs its tasks
    assert host.item() == 3
    stream.close()


def test_the_host_wait_mode_comes_from_the_environment_and_a_wrong_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(process_stream.HOST_WAIT_ENV, raising=False)
    assert ProcessStream()._spin == process_stream.HOST_SPIN_SECONDS  # spin by default
    monkeypatch.setenv(process_stream.HOST_WAIT_ENV, " Block ")
    assert ProcessStream()._spin == 0
    monkeypatch.setenv(process_stream.HOST_WAIT_ENV, "busy")
    with pytest.raises(ConfigError, match="TOKENSTATE_HOST_WAIT='busy' is not a host wait mode; valid values: spin, block"):
        ProcessStream()


def test_a_host_waiting_longer_than_its_spin_sleeps_and_still_sees_the_event(started) -> None:
    stream, _, host = started
    stream.submit(time.sleep, 0.3)
    stream.submit(_fill, host[:1], 4)
    cpu_before = time.process_time()
    stream.synchronize()
    assert host[0].item() == 4
    # Either way the host slept through most of the wait: it polls for 2 ms at most.
    assert time.process_time() - cpu_before < 0.1


def test_the_device_process_needs_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_stream.sys, "platform", "darwin")
    with pytest.raises(ConfigError, match="cpu_stream='process' needs Linux"):
        stream_for(torch.device("cpu"), cpu_stream="process")


PROMPTS = [[5, 6, 7], [9, 3, 4, 1], [11, 12], [2, 8, 8, 8, 8, 8], [40, 41, 42, 43, 44, 45, 46, 47, 48]]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"kv_cache_tokens": 24, "scheduling_order": "random", "max_num_batched_tokens": 8},
        {"speculative": {"method": "ngram", "num_tokens": 2}},
        {"chaos": 3},
    ],
    ids=["plain", "preempt-random-chunked", "ngram-drafts", "chaos"],
)
def test_async_on_the_device_process_gives_the_synchronous_tokens(options: dict) -> None:
    params = [
        SamplingParams(max_tokens=14, ignore_eos=True),
        SamplingParams(max_tokens=9, ignore_eos=True, repetition_penalty=1.3, bad_words=[[13]]),
        SamplingParams(max_tokens=11, ignore_eos=True, temperature=0.8, top_k=8, seed=4),
        SamplingParams(max_tokens=12, ignore_eos=True, frequency_penalty=0.4),
        SamplingParams(max_tokens=10, ignore_eos=True),
    ]
    sync = LLM("tiny-llama", async_scheduling=False, max_num_seqs=3, **options | {"chaos": None})
    expected = [o.token_ids for o in sync.generate(PROMPTS, params)]
    llm = LLM("tiny-llama", max_num_seqs=3, cpu_stream="process", **options)
    assert isinstance(llm._engine.runner.stream, ProcessStream)
    for _ in range(2):  # a second call reuses the slots, the buffers and the device process
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
    assert llm.stats.async_steps > 0 and llm.stats.fallback_steps == 0


def test_a_stale_host_read_in_the_device_process_raises_at_the_sync_point() -> None:
    llm = LLM(toy_factory(embed="host", honors=True), cpu_stream="process")
    with pytest.raises(StaleHostTokensError, match="stale host token ids read at rows") as raised:
        llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert raised.value.rows  # the error's fields crossed the process boundary too
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=1))  # the engine recovered
    assert len(out[0].token_ids) == 1


def test_a_placeholder_embedded_in_the_device_process_is_reported_with_its_rows() -> None:
    llm = LLM(toy_factory(embed="private", honors=True), max_num_batched_tokens=64, cpu_stream="process")
    with pytest.raises(EmbeddedBadIdsError, match=r"ids outside \[0, vocab=128\).*rows \[0, 1, 2"):
        llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))


def test_dropping_the_engine_stops_its_device_process() -> None:
    import gc

    llm = LLM("tiny-llama", max_num_seqs=2, cpu_stream="process")
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, ignore_eos=True))
    pid = llm._engine.runner.stream._link.pid
    del llm
    gc.collect()  # the runner and its stream reference each other: the cycle collector frees them
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped by the stream's finalizer


def test_a_killed_device_process_is_reported_once_and_the_engine_says_it_is_closed() -> None:
    import signal

    llm = LLM("tiny-llama", max_num_seqs=2, cpu_stream="process")
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    llm.generate(PROMPTS[:2], params)
    os.kill(llm._engine.runner.stream._link.pid, signal.SIGKILL)
    with pytest.raises(TokenStateError, match=r"the device process (is gone|exited)") as raised:
        llm.generate(PROMPTS[:2], params)
    assert raised.value.__context__ is None or not isinstance(raised.value.__context__, TokenStateError)
    with pytest.raises(TokenStateError, match="process stream: closed"):
        llm.generate(PROMPTS[:2], params)


@pytest.mark.parametrize("where", ["reading a reply", "sending"])
def test_an_interrupt_inside_a_pipe_message_never_hangs_and_the_engine_says_why_it_closed(where) -> None:
    """Ctrl-C between a message's header and its body leaves the pipe out of step: the engine
    gives the device process up at once (no wait on a reply that cannot come) and says so."""
    llm = LLM("tiny-llama", max_num_seqs=2, cpu_stream="process")
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    llm.generate(PROMPTS[:2], params)
    link = llm._engine.runner.stream._link
    pid = link.pid
    conn = link.replies if where == "reading a reply" else link.commands
    method = "_recv" if where == "reading a reply" else "_send"
    original = getattr(conn, method)
    armed = [True]

    def interrupted(*args):  # a SIGINT handled between the frame's two reads (or writes)
        result = original(*args)
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        return result

    setattr(conn, method, interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[:2], params)
    with pytest.raises(TokenStateError, match=rf"process stream: closed \(interrupted while {where}.*start a new LLM"):
        llm.generate(PROMPTS[:2], params)
    assert not llm.has_unfinished_requests()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # the device process was stopped and reaped


def test_close_releases_every_descriptor_of_the_shared_buffers_while_the_llm_is_still_referenced() -> None:
    """A server may keep closed engines around: ``close()`` itself must free their descriptors."""
    def memfds() -> int:
        return sum("tokenstate-host-buffer" in os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    before = memfds()
    kept = []
    for _ in range(3):
        llm = LLM("tiny-llama", max_num_seqs=2, cpu_stream="process")
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, ignore_eos=True))
        llm.close()
        kept.append(llm)
    assert memfds() == before
