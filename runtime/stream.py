"""Streams: where a step's device work runs, in submission order, fenced by events.

The runner touches device tensors only inside stream tasks. It *submits* device work (reseeding
admitted slots, the upload copy, combine, forward, sampling, post-update, the copy back) to a
stream, and *records* events after it; the host only waits on an event, at a fence. Five stream
implementations share that one interface, so the mirror and the runner have one code path (the
fifth, :class:`~tokenstate.runtime.process_stream.ProcessStream`, runs the device work in a forked
device process; it lives in its own module):

* :class:`CpuStream` — one worker thread that owns the device tensors and runs the submitted tasks
  in order. torch releases the GIL inside its ops, so while the worker runs step N's forward the
  host thread prepares step N+1 — though the Python around every op holds the GIL, so the two
  threads overlap only partly (the device process overlaps fully) — and every fence the async path
  needs is a real fence here too.
* :class:`CudaStream` — a ``torch.cuda.Stream``: submitting a task launches its kernels on the
  stream, events are ``torch.cuda.Event``.
* :class:`InlineStream` — the CPU without a worker: a task runs in the submitting thread when it is
  submitted, so every event is passed as soon as it is recorded. The runner's code path is the same
  (the host still reads a step's tokens only at its fence); what it gives up is the overlap, and
  with it the hand-offs between two threads that, under the GIL, cost more than the overlap saves
  on a CPU (measured in ``docs/concepts/runner-paths.md``). It is the CPU default; chaos and the
  ordering tests use :class:`CpuStream`, where a missing fence can show.
* :class:`DeferredStream` — the CPU without a worker, the other way round: a task runs only when the
  host waits on an event recorded after it, so the device work is always as late as the fences let
  it be — the host plans every step it can before the device has run any of the work it already
  submitted. One fixed order, the latest a device may legally take: a fence the host skips, or host
  state a task changes behind the host's back, shows up on every run, where the threaded stream
  needs chaos and luck. For testing and the gate; it gives no overlap.

An exception raised by a task is kept and re-raised by every later fence — an event recorded after
that task (:meth:`StreamEvent.synchronize`) or :meth:`synchronize` — the way a device error surfaces
at the next sync; later tasks are skipped until :meth:`reset`. An event recorded before the failed
task does not raise it: step N's sync point never reports step N+1's fault.

**Chaos.** ``Chaos(seed)`` (or ``TOKENSTATE_CHAOS=seed``, or ``LLM(chaos=seed)``) pauses the stream
before its tasks and the host at the runner's hand-over points for seeded random times, so every
interleaving a real device produces — the device far behind the host, or idle and waiting — shows up
within a few hundred steps. A missing fence then reads as a wrong token or a contract violation.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import itertools
import os
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from tokenstate.contracts import ConfigError, TokenStateError, validated_setting

__all__ = [
    "CHAOS_ENV",
    "CPU_STREAMS",
    "CPU_STREAM_ENV",
    "Chaos",
    "CpuStream",
    "CpuStreamKind",
    "CudaStream",
    "DeferredStream",
    "DeviceStream",
    "InlineStream",
    "StreamEvent",
    "chaos_from_env",
    "choose_cpu_stream",
    "cpu_stream_from_env",
    "stream_for",
]

CHAOS_ENV = "TOKENSTATE_CHAOS"
CPU_STREAM_ENV = "TOKENSTATE_CPU_STREAM"
CpuStreamKind = Literal["inline", "thread", "process", "deferred"]
CPU_STREAMS: tuple[str, ...] = ("inline", "thread", "process", "deferred")


class Chaos:
    """Seeded random pauses for the stream and the host (two generators: one per thread).

    Args:
        seed: the run's seed; the same seed gives the same sequence of pauses on each side.
        probability: chance that a given hand-over point pauses at all.
        max_delay_s: the longest pause, drawn uniformly from ``[0, max_delay_s]``.
    """

    def __init__(self, seed: int, *, probability: float = 0.5, max_delay_s: float = 0.002) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"chaos: the seed must be an int >= 0, got {seed!r}.")
        if not 0.0 <= probability <= 1.0 or not 0.0 <= max_delay_s <= 1.0:
            raise ConfigError(
                f"chaos: probability must lie in [0, 1] and max_delay_s in [0, 1] s, got "
                f"{probability!r} and {max_delay_s!r}."
            )
        self.seed = seed
        self.probability = probability
        self.max_delay_s = max_delay_s
        self._stream_rng = random.Random(seed * 2 + 1)
        self._host_rng = random.Random(seed * 2)

    def _delay(self, rng: random.Random) -> float:
        if rng.random() >= self.probability:
            return 0.0
        return rng.uniform(0.0, self.max_delay_s)

    def stream_delay(self) -> float:
        """The next pause before a stream task, in seconds (only the stream's thread calls this)."""
        return self._delay(self._stream_rng)

    def host_pause(self) -> None:
        """Pause the host thread for its next drawn time (only the host thread calls this)."""
        delay = self._delay(self._host_rng)
        if delay:
            time.sleep(delay)

    def __repr__(self) -> str:
        return f"Chaos(seed={self.seed})"


def chaos_from_env() -> Chaos | None:
    """``Chaos`` from ``TOKENSTATE_CHAOS`` (an int seed >= 0); unset or empty: ``None``."""
    value = os.environ.get(CHAOS_ENV, "").strip()
    if not value:
        return None
    try:
        seed = int(value)
    except ValueError:
        seed = -1
    if seed < 0:
        raise ConfigError(
            f"{CHAOS_ENV}={value!r} is not a seed; set it to an int >= 0 (e.g. {CHAOS_ENV}=1) or "
            "unset it to run without chaos."
        )
    return Chaos(seed)


def cpu_stream_from_env() -> CpuStreamKind | None:
    """The CPU stream kind from ``TOKENSTATE_CPU_STREAM`` (``inline``, ``thread`` or ``process``,
    read like every string setting: case and blanks ignored); unset: ``None``."""
    value = os.environ.get(CPU_STREAM_ENV, "")
    if not value.strip():
        return None
    default = "unset: inline, or thread under chaos"
    return validated_setting(value, CPU_STREAM_ENV, CPU_STREAMS, what="CPU stream", default=default)  # type: ignore[return-value]


def choose_cpu_stream(requested: str | None, chaos: Chaos | None) -> CpuStreamKind:
    """The CPU stream an engine runs on: ``requested`` (an ``LLM`` option), else
    ``TOKENSTATE_CPU_STREAM``, else ``"thread"`` under chaos and ``"inline"`` without it.

    Inline is the default because on a CPU the worker thread's overlap does not pay (both threads'
    Python runs under one GIL; measured in ``docs/concepts/runner-paths.md``), and the device
    process (``"process"``) takes a second core; chaos perturbs the order of two threads or
    processes, so it needs one of those, and asking for chaos inline or deferred (each one fixed
    order) is refused.
    """
    kind = requested if requested is not None else cpu_stream_from_env()
    if kind is None:
        return "thread" if chaos is not None else "inline"
    if kind not in CPU_STREAMS:
        raise ConfigError(f"cpu_stream must be one of {list(CPU_STREAMS)}, got {kind!r}.")
    if kind in ("inline", "deferred") and chaos is not None:
        raise ConfigError(
            "chaos needs the threaded CPU stream or the device process (it perturbs the order of two "
            "threads or processes); use cpu_stream='thread' or 'process' with chaos (or unset "
            "TOKENSTATE_CPU_STREAM), or drop chaos."
        )
    return kind  # type: ignore[return-value]


class _Faults:
    """The first exception a stream's task raised, and that task's index in submission order.

    Shared by the stream, its worker and its events: an event re-raises the exception only if the
    failed task was submitted before the event was recorded.
    """

    __slots__ = ("error", "index")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.index = 0

    def fail(self, index: int, error: BaseException) -> None:
        if self.error is None:
            self.error, self.index = error, index

    def run(self, index: int, context: contextvars.Context, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        """Run task ``index`` in ``context`` unless an earlier one failed (a failed task poisons the
        stream until reset(), as a device error does); keep its exception for the next fence."""
        if self.error is not None:
            return
        try:
            context.run(fn, *args)
        except BaseException as exc:  # kept and re-raised at the next fence
            self.fail(index, exc)

    def raise_if_failed(self, before: int | None = None) -> None:
        """Raise the kept exception (of a task submitted before ``before``, when given)."""
        if self.error is not None and (before is None or self.index < before):
            raise self.error


@runtime_checkable
class StreamEvent(Protocol):
    """A point in a stream's order; the host waits on it at a fence."""

    def synchronize(self) -> None:
        """Block until the stream passed this point; re-raise a task's exception from before it."""

    def wait(self) -> None:
        """Block until the stream passed this point; a task's exception is left to the next
        :meth:`synchronize` (a buffer fence is not the step's sync point)."""

    def query(self) -> bool:
        """Whether the stream passed this point (never blocks)."""


@runtime_checkable
class DeviceStream(Protocol):
    """Where device work runs, in submission order (see the module docstring)."""

    device: torch.device

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Enqueue ``fn(*args)``; it runs after everything submitted before it."""

    def record_event(self) -> StreamEvent:
        """An event the stream reaches once everything submitted so far has run."""

    def synchronize(self) -> None:
        """Wait for everything submitted so far; re-raise a task's exception."""

    def reset(self) -> None:
        """Wait for the stream to drain, drop a kept exception and run tasks again."""

    def host_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``[numel]`` host buffer the stream's copies read or write (pinned on CUDA)."""

    def device_buffer(self, owner: object, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Set ``owner.name`` to a fresh ``[numel]`` device buffer and return it."""

    def start(self, objects: Iterable[object]) -> None:
        """The device-side objects (runner, mirror, model) are complete; tasks may follow."""

    def close(self) -> None:
        """Stop the stream's worker thread or device process, if it has one, now (idempotent);
        a stopped one refuses further tasks (the ``LLM`` that owns the stream refuses them first)."""


class _InProcessBuffers:
    """Buffers of a stream whose device work runs in this process: plain (or pinned) allocations."""

    device: torch.device

    def host_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, pin_memory=self.device.type == "cuda")

    def device_buffer(self, owner: object, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(numel, dtype=dtype, device=self.device)
        setattr(owner, name, tensor)
        return tensor

    def start(self, objects: Iterable[object]) -> None:
        pass  # the device works on the very objects the host built

    def close(self) -> None:
        pass  # tasks run in the submitting thread (inline) or on the GPU: no worker to stop


def _inference_mode() -> contextlib.AbstractContextManager[object]:
    """Inference mode for tasks run in the host thread — which the engine's step already holds
    (entering it again would cost a µs a task)."""
    return contextlib.nullcontext() if torch.is_inference_mode_enabled() else torch.inference_mode()


class _CpuEvent:
    __slots__ = ("_done", "_faults", "_index")

    def __init__(self, faults: _Faults, index: int) -> None:
        self._done = threading.Event()
        self._faults = faults
        self._index = index  # tasks submitted before this event

    def synchronize(self) -> None:
        self._done.wait()
        self._faults.raise_if_failed(before=self._index)

    def wait(self) -> None:
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()


_Task = tuple[int, contextvars.Context, Callable[..., object], tuple[Any, ...]]


def _work(tasks: queue.SimpleQueue[_Task | _CpuEvent | None], faults: _Faults, chaos: Chaos | None) -> None:
    """The worker's loop. It holds no reference to its stream, so a dropped stream is collected:
    each item is handled in a call of its own, so nothing of the last task (a bound method of the
    runner, which holds the stream) stays in this frame while it waits for the next one."""
    with torch.inference_mode():  # grad mode is per thread: the worker sets its own
        while _handle(tasks.get(), faults, chaos):
            pass


def _handle(item: _Task | _CpuEvent | None, faults: _Faults, chaos: Chaos | None) -> bool:
    """Run one task or pass one event; ``False`` for the stop marker."""
    if item is None:
        return False
    if isinstance(item, _CpuEvent):
        item._done.set()
        return True
    if chaos is not None:
        delay = chaos.stream_delay()
        if delay:
            time.sleep(delay)
    faults.run(*item)
    return True


# Live workers, stopped and joined at exit: a daemon thread torn down by interpreter shutdown
# while it still holds torch's thread-local state aborts the process.
_workers: dict[int, tuple[threading.Thread, queue.SimpleQueue[Any]]] = {}
# A stream's key in _workers, never reused: a worker's id() is, once its thread object is freed,
# and a collected stream's finalizer then stopped the next stream's worker under the same key.
_worker_keys = itertools.count()


def _stop(key: int) -> None:
    worker = _workers.pop(key, None)
    if worker is not None:
        thread, tasks = worker
        tasks.put(None)
        if thread is not threading.current_thread():
            thread.join()


@atexit.register
def _stop_all() -> None:
    for key in list(_workers):
        _stop(key)


class CpuStream(_InProcessBuffers):
    """A stream on the CPU: one worker thread runs the submitted tasks in order.

    Each task runs in a copy of the submitter's :mod:`contextvars` context (the checks mode, the step
    guard) and under ``torch.inference_mode``.
    """

    device = torch.device("cpu")

    def __init__(self, chaos: Chaos | None = None) -> None:
        self._tasks: queue.SimpleQueue[_Task | _CpuEvent | None] = queue.SimpleQueue()
        self._faults = _Faults()
        self._submitted = 0
        worker = threading.Thread(
            target=_work, args=(self._tasks, self._faults, chaos), name="tokenstate-cpu-stream",
            daemon=True,
        )  # fmt: skip
        worker.start()
        self._key = next(_worker_keys)
        self._owner = os.getpid()  # a process forked from this one inherits the stream, not the worker
        _workers[self._key] = (worker, self._tasks)
        weakref.finalize(self, _stop, self._key)  # stop the worker with its stream

    def _require_open(self) -> None:
        if self._owner != os.getpid():  # its events would never pass either
            raise ConfigError(
                f"CPU stream: its worker thread runs in process {self._owner}; a process forked from it "
                "has none. Create the LLM in the forked process."
            )
        if self._key not in _workers:  # a closed stream's events would never pass
            raise TokenStateError("CPU stream: closed, its worker thread is stopped; start a new LLM.")

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        self._require_open()
        self._tasks.put((self._submitted, contextvars.copy_context(), fn, args))
        self._submitted += 1

    def close(self) -> None:
        """Run what was submitted, then stop and join the worker thread (idempotent)."""
        _stop(self._key)

    def record_event(self) -> _CpuEvent:
        self._require_open()
        event = _CpuEvent(self._faults, self._submitted)
        self._tasks.put(event)
        return event

    def synchronize(self) -> None:
        self.record_event().synchronize()

    def reset(self) -> None:
        self.record_event().wait()
        self._faults.error = None


class _PassedEvent:
    """An :class:`InlineStream` event: everything submitted before it has already run."""

    __slots__ = ("_faults", "_index")

    def __init__(self, faults: _Faults, index: int) -> None:
        self._faults = faults
        self._index = index

    def synchronize(self) -> None:
        self._faults.raise_if_failed(before=self._index)

    def wait(self) -> None:
        pass

    def query(self) -> bool:
        return True


class InlineStream(_InProcessBuffers):
    """A stream on the CPU that runs each task in the submitting thread, at submit time.

    The same contract as :class:`CpuStream` — tasks in order, under ``torch.inference_mode``; a
    failed task's exception kept for the next fence and later tasks skipped until :meth:`reset` —
    with no worker: nothing runs concurrently, so no event is ever waited on.
    """

    device = torch.device("cpu")

    def __init__(self) -> None:
        self._faults = _Faults()
        self._submitted = 0

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        index, self._submitted = self._submitted, self._submitted + 1
        if self._faults.error is not None:
            return  # poisoned until reset(), as CpuStream (no context copied for nothing)
        with _inference_mode():  # in a copy of the context, as a worker's task runs
            self._faults.run(index, contextvars.copy_context(), fn, args)

    def record_event(self) -> _PassedEvent:
        return _PassedEvent(self._faults, self._submitted)

    def synchronize(self) -> None:
        self._faults.raise_if_failed()

    def reset(self) -> None:
        self._faults.error = None


class _DeferredEvent:
    """A :class:`DeferredStream` event: waiting on it runs the tasks submitted before it."""

    __slots__ = ("_index", "_stream")

    def __init__(self, stream: DeferredStream, index: int) -> None:
        self._stream = stream
        self._index = index

    def synchronize(self) -> None:
        self._stream._run_before(self._index)
        self._stream._faults.raise_if_failed(before=self._index)

    def wait(self) -> None:
        self._stream._run_before(self._index)

    def query(self) -> bool:
        return self._stream._ran >= self._index


class DeferredStream(_InProcessBuffers):
    """A stream on the CPU whose tasks run in the host thread only when the host waits past them.

    The same contract as :class:`InlineStream` (tasks in order, each in a copy of its submitter's
    context and under ``torch.inference_mode``; a failed task's exception kept for the next fence,
    later tasks skipped until :meth:`reset`), at the other extreme of timing: see the module
    docstring.
    """

    device = torch.device("cpu")

    def __init__(self) -> None:
        self._faults = _Faults()
        self._queued: collections.deque[_Task] = collections.deque()
        self._submitted = 0
        self._ran = 0  # tasks run (or skipped) so far: those with index < _ran

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        self._queued.append((self._submitted, contextvars.copy_context(), fn, args))
        self._submitted += 1

    def _run_before(self, index: int) -> None:
        """Run the queued tasks submitted before ``index``, in order."""
        with _inference_mode():
            while self._queued and self._queued[0][0] < index:
                task = self._queued.popleft()
                self._ran = task[0] + 1
                self._faults.run(*task)

    def record_event(self) -> _DeferredEvent:
        return _DeferredEvent(self, self._submitted)

    def synchronize(self) -> None:
        self._run_before(self._submitted)
        self._faults.raise_if_failed()

    def reset(self) -> None:
        self._run_before(self._submitted)
        self._faults.error = None

    def close(self) -> None:
        """Run what was submitted (as :meth:`CpuStream.close` lets its worker finish)."""
        self._run_before(self._submitted)


class _CudaEvent:
    __slots__ = ("_event", "_faults", "_index")

    def __init__(self, stream: torch.cuda.Stream, faults: _Faults, index: int) -> None:
        self._event = torch.cuda.Event()
        self._event.record(stream)
        self._faults = faults
        self._index = index

    def synchronize(self) -> None:
        self._event.synchronize()
        self._faults.raise_if_failed(before=self._index)

    def wait(self) -> None:
        self._event.synchronize()

    def query(self) -> bool:
        return bool(self._event.query())


class CudaStream(_InProcessBuffers):
    """A stream on a CUDA device: a task's kernels are launched on one ``torch.cuda.Stream``.

    Chaos pauses the stream with ``torch.cuda._sleep`` (spinning on the device) before each task.
    """

    def __init__(self, device: torch.device, chaos: Chaos | None = None) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device)
        self._faults = _Faults()
        self._submitted = 0
        self._chaos = chaos
        self._cycles_per_s = 1.0e9  # a rough clock: chaos needs a spread of delays, not exact ones

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        index, self._submitted = self._submitted, self._submitted + 1
        if self._faults.error is not None:
            return
        with torch.cuda.stream(self._stream), torch.inference_mode():
            if self._chaos is not None:
                delay = self._chaos.stream_delay()
                if delay:
                    torch.cuda._sleep(int(delay * self._cycles_per_s))
            try:
                fn(*args)
            except BaseException as exc:  # re-raised at the next fence, as on the CPU
                self._faults.fail(index, exc)

    def record_event(self) -> _CudaEvent:
        return _CudaEvent(self._stream, self._faults, self._submitted)

    def synchronize(self) -> None:
        self._stream.synchronize()
        self._faults.raise_if_failed()

    def reset(self) -> None:
        self._stream.synchronize()
        self._faults.error = None


def stream_for(device: torch.device, chaos: Chaos | None = None, cpu_stream: str | None = None) -> DeviceStream:
    """The stream implementation for ``device`` (``cpu`` or ``cuda``).

    On the CPU, ``cpu_stream`` (``"inline"``, ``"thread"``, ``"process"``, ``"deferred"`` or
    ``None``, resolved by :func:`choose_cpu_stream`) picks :class:`InlineStream`,
    :class:`CpuStream`, :class:`~tokenstate.runtime.process_stream.ProcessStream` or
    :class:`DeferredStream`.
    """
    if device.type == "cuda":
        return CudaStream(device, chaos)
    if device.type == "cpu":
        kind = choose_cpu_stream(cpu_stream, chaos)
        if kind == "process":
            from tokenstate.runtime.process_stream import ProcessStream  # it builds on this module

            return ProcessStream(chaos)
        if kind == "thread":
            return CpuStream(chaos)
        if kind == "deferred":
            return DeferredStream()
        return InlineStream()
    raise ConfigError(f"no stream for device {device}; use 'cpu' or 'cuda'.")
