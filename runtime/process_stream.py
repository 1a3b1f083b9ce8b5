"""The CPU device as a process: a stream whose tasks run in a forked device process.

A :class:`~tokenstate.runtime.stream.CpuStream` worker thread overlaps only the time both threads
spend outside the GIL, and the forward's Python (module calls, op dispatch) holds it — so on a CPU
the threaded async engine never beat the synchronous one (*Runner paths*). A process has its own
interpreter: while the device process runs step N's forward, the host process prepares step N+1 in
parallel, Python and all, exactly as a host thread does beside a GPU. That is what this stream is.

**How.** The runner calls :meth:`ProcessStream.start` once its device-side objects exist (itself, the
mirror, the model); the stream forks there. The device process inherits a copy of every object and
tensor at that moment — model weights, KV caches and the mirror's slot state live on in it, and only
it writes them from then on. Each :meth:`~ProcessStream.submit` pickles the task to the device
process through a pipe:

* an object that existed at the fork (the runner, the mirror, the model) travels as its identity
  and resolves to the device process's copy, so ``runner._device_step`` runs on the device's runner;
* a tensor inside one of those objects' device buffers (a view of the mirror's upload buffer, say)
  travels as ``(buffer, offset, size, stride)`` and becomes the same view of the device's buffer;
* a host buffer both sides touch (upload staging, step results) is shared memory
  (:meth:`~ProcessStream.host_buffer`, a ``memfd`` both processes map), so the device reads what
  the host staged and the host reads what the device wrote — after the event, as on a GPU;
* everything else (the step's host ids, its layout and index plan, the host's ``StepSampling``) is
  copied; a request travels as its sampling parameters only (all a device task reads of it).

Events are markers in the same pipe: the device process answers one when it reaches it, so an event
is passed exactly when every task submitted before it has run. A task's exception is kept, skips the
later tasks until :meth:`~ProcessStream.reset`, and is re-raised by the next fence, as on the other
streams; the contract violations a guarded embedding records in the device process travel back to
the host's :class:`~tokenstate.runtime.kernels.StepGuard` before the step's event, so the step's
sync point raises them naming rows and slots.

Linux only (``os.fork``, ``memfd_create``); the device process runs one intra-op thread
(GNU OpenMP is not fork-safe once its thread pool exists), so this stream suits machines where one
core computes and another hosts — the shape of a GPU server. Chaos mode pauses the device process
before its tasks and the host at its hand-over points. The device's side of the pipe is
:mod:`tokenstate.runtime._device_process`.

What it buys, measured on a 2-core machine: 1.1–1.2x the synchronous engine on tiny-llama (a
third of whose step is host work), and about even on a model whose forward dominates; each step's
hand-over (one task, one event) costs the device process about 0.2 ms, most of it unpickling
(*Runner paths → The device process*; *Design notes → The device process*). While it
waits for the device, the host polls the reply pipe for up to 2 ms before it sleeps
(:func:`host_wait_mode`, ``TOKENSTATE_HOST_WAIT=spin|block``).
"""

from __future__ import annotations

import atexit
import contextlib
import copyreg
import io
import os
import pickle
import select
import signal
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

import torch

from tokenstate.contracts import ConfigError, TokenStateError, get_checks_mode, validated_setting
from tokenstate.runtime._device_process import (
    Device,
    RequestOnDevice,
    allocate,
    device_guard,
    device_object,
    device_view,
    dumps,
    serve_forever,
    shared_view,
    tensor_by_value,
)
from tokenstate.runtime.kernels.guard import StepGuard
from tokenstate.runtime.request import Request
from tokenstate.runtime.stream import Chaos

__all__ = ["HOST_SPIN_SECONDS", "HOST_WAIT_ENV", "HOST_WAIT_MODES", "ProcessStream", "host_wait_mode", "process_stream_available"]

HOST_WAIT_ENV = "TOKENSTATE_HOST_WAIT"
HOST_WAIT_MODES: tuple[str, ...] = ("spin", "block")
HOST_SPIN_SECONDS = 0.002
"""How long a waiting host polls for the device process's answer before it sleeps (``spin``)."""


def host_wait_mode() -> str:
    """How the host waits for the device process: ``$TOKENSTATE_HOST_WAIT``, else ``spin``.

    ``spin`` (the default) polls the reply pipe for up to :data:`HOST_SPIN_SECONDS`, yielding the
    core at every poll, and only then sleeps in the kernel; ``block`` sleeps at once. Why: the
    device process answers the event a host waits on at the end of every step, and writing to a
    pipe that a sleeping process waits on costs the writer the wake-up — about 65 µs a step on the
    2-core development machine (a virtual one), against 15 for the same write while the host
    polls — and the device process is the bottleneck. Like CUDA's ``cudaDeviceScheduleSpin`` it
    spends the host's core while it waits, which is idle then; ``block`` suits shared cores.
    """
    return validated_setting(
        os.environ.get(HOST_WAIT_ENV, "spin"), HOST_WAIT_ENV, HOST_WAIT_MODES,
        what="host wait mode", default="spin, which polls up to 2 ms before it sleeps",
    )  # fmt: skip


def process_stream_available() -> bool:
    """Whether this platform can run the device process (Linux: ``os.fork`` and ``memfd_create``)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(os, "fork")


class _SharedBuffer:
    """A host buffer in memory both processes map: an anonymous ``memfd`` mapped shared. The device
    process inherits the mapping of one made before the fork and opens a later one through
    ``/proc/<host pid>/fd`` the first time a task names it."""

    __slots__ = ("fd", "nbytes", "tensor")

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.nbytes = max(1, numel) * torch.empty((), dtype=dtype).element_size()
        self.fd = os.memfd_create("tokenstate-host-buffer", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.nbytes)
        # torch maps the file shared and keeps no descriptor of its own (an ``mmap.mmap`` would
        # keep a duplicate that only the mapping's last tensor frees): close() frees the one fd.
        self.tensor = torch.from_file(f"/proc/self/fd/{self.fd}", shared=True, size=max(1, numel), dtype=dtype)[:numel]  # [numel]

    def close(self) -> None:
        os.close(self.fd)


def _tensor_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _device_tensors_of(objects: Iterable[object]) -> dict[int, tuple[int, str]]:
    """``storage -> (object id, attribute)`` for every tensor attribute of ``objects`` (device state)."""
    found: dict[int, tuple[int, str]] = {}
    for obj in objects:
        names = list(vars(obj)) if hasattr(obj, "__dict__") else []
        names += [s for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
        for name in names:
            value = getattr(obj, name)
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                found.setdefault(_tensor_key(value), (id(obj), name))
    return found


class _HostPickler(pickle.Pickler):
    """Pickles a task for the device process (see the module docstring for what travels how).

    Per-type reducers in a ``dispatch_table`` (not ``reducer_override`` or ``persistent_id``, which
    the C pickler calls for every object): a step's many tuples, arrays and numbers cost no Python
    call each.
    """

    def __init__(self, file: io.BytesIO, stream: ProcessStream) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = stream._dispatch


def _host_dispatch(stream: ProcessStream, types: Iterable[type]) -> dict[type, Callable[[Any], Any]]:
    """The host pickler's reducers: tensors, requests, step guards and the objects given to start()."""

    def reduce_tensor(obj: torch.Tensor) -> Any:
        key = _tensor_key(obj)
        view = (obj.dtype, obj.storage_offset(), tuple(obj.shape), obj.stride())
        if key in stream._link.shared:
            return shared_view, (key, *view)
        owner = stream._device_tensors.get(key)
        if owner is not None:
            return device_view, (owner, *view)
        if obj.device.type != "cpu":
            raise ConfigError(f"process stream: a task argument is a {obj.device} tensor; only CPU tensors travel.")
        return tensor_by_value(obj)

    def reduce_request(obj: Request) -> Any:
        return RequestOnDevice, (obj.params, obj.request_id, obj.slot)

    def reduce_guard(obj: StepGuard) -> Any:
        stream._guards[id(obj)] = (stream._submitted, obj)
        return device_guard, (id(obj),)

    def reduce_started(obj: object) -> Any:
        if id(obj) in stream._objects:
            return device_object, (id(obj),)
        return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # another instance of the type: by value

    table: dict[type, Callable[[Any], Any]] = dict(copyreg.dispatch_table)
    table.update({t: reduce_started for t in types})
    table.update({torch.Tensor: reduce_tensor, Request: reduce_request, StepGuard: reduce_guard})
    return table


class _Link:
    """The host's end of the device process: pipes, pid, shared buffers, unsent messages.

    Kept apart from the stream so that the stream's finalizer can shut the device process down
    without holding the stream (or the runner it references) alive.
    """

    __slots__ = ("closed", "commands", "outbox", "owner", "pid", "replies", "shared", "why_closed")

    def __init__(self) -> None:
        self.commands: Connection | None = None
        self.replies: Connection | None = None
        self.pid: int | None = None
        self.owner = os.getpid()  # the host: a process forked from it inherits this link, not its device
        self.closed = False
        self.why_closed = "its device process is gone"  # said by every later call
        self.outbox: list[bytes] = []  # framed messages not yet sent (see ProcessStream._post)
        self.shared: dict[int, _SharedBuffer] = {}  # storage address -> buffer


_live: weakref.WeakValueDictionary[int, ProcessStream] = weakref.WeakValueDictionary()
"""Live streams: each device process closes the others' pipes (so they see EOF when their host goes)."""


@atexit.register
def _stop_all() -> None:
    for stream in list(_live.values()):
        stream.close()


class _ProcessEvent:
    __slots__ = ("_index", "_stream")

    def __init__(self, stream: ProcessStream, index: int) -> None:
        self._stream = stream
        self._index = index  # tasks submitted before this event

    def synchronize(self) -> None:
        self._stream._wait(self._index)
        self._stream._raise_if_failed(before=self._index)

    def wait(self) -> None:
        self._stream._wait(self._index)

    def query(self) -> bool:
        self._stream._drain()
        return self._stream._passed >= self._index


class ProcessStream:
    """A stream on the CPU whose tasks run in a forked device process (see the module docstring)."""

    device = torch.device("cpu")

    def __init__(self, chaos: Chaos | None = None) -> None:
        if not process_stream_available():
            raise ConfigError(
                "cpu_stream='process' needs Linux (os.fork and memfd_create); use cpu_stream='inline' "
                "or 'thread' on this platform."
            )
        self.chaos = chaos
        self._submitted = 0
        self._passed = 0  # tasks the device process has reached, as of the last answered event
        self._fault: BaseException | None = None
        self._fault_index = 0
        self._objects: dict[int, object] = {}
        self._device_tensors: dict[int, tuple[int, str]] = {}  # storage -> (object id, attribute)
        self._guards: dict[int, tuple[int, StepGuard]] = {}
        self._spin = HOST_SPIN_SECONDS if host_wait_mode() == "spin" else 0.0
        # Whether a reply is waiting (a look, never a wait); start() points it at the reply pipe.
        self._replies_ready: Callable[[], bool] = lambda: False
        self._dispatch = _host_dispatch(self, ())
        self._link = _Link()
        _live[id(self)] = self
        weakref.finalize(self, _shut_down, self._link)

    # -- set-up ----------------------------------------------------------------------------------

    def host_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``[numel]`` host buffer the device process reads and writes too (shared memory)."""
        shared = _SharedBuffer(numel, dtype)
        key = _tensor_key(shared.tensor)
        self._link.shared[key] = shared
        if self._link.commands is not None:  # made after the fork: tell the device where it is
            self._post(b"s" + pickle.dumps((key, (shared.fd, shared.nbytes, dtype, numel))))
        return shared.tensor

    def device_buffer(self, owner: object, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Set ``owner.name`` to a fresh ``[numel]`` device buffer, on both sides of the fork.

        Before :meth:`start` this is a plain allocation (the fork copies it); after it, the device
        process allocates its own in stream order, and views of the host's copy travel as views of it.
        """
        tensor = torch.empty(numel, dtype=dtype)
        old = getattr(owner, name, None)
        setattr(owner, name, tensor)
        if self._link.pid is not None:
            if id(owner) not in self._objects:
                raise ConfigError(f"process stream: {type(owner).__name__} was not given to start().")
            if isinstance(old, torch.Tensor):
                # Steps already submitted carried their views; once freed, its address may be reused.
                self._device_tensors.pop(_tensor_key(old), None)
            self._device_tensors[_tensor_key(tensor)] = (id(owner), name)
            self.submit(allocate, owner, name, numel, dtype)
        return tensor

    def start(self, objects: Iterable[object]) -> None:
        """Fork the device process; ``objects`` (and their tensors) become the device's from here on."""
        if self._link.pid is not None:
            raise ConfigError("process stream: start() was called twice.")
        objects = list(objects)
        self._objects = {id(o): o for o in objects}
        self._dispatch = _host_dispatch(self, {type(o) for o in objects})
        self._device_tensors = {k: v for k, v in _device_tensors_of(objects).items() if k not in self._link.shared}
        inherited = {k: b.tensor for k, b in self._link.shared.items()}  # mapped shared: the fork keeps them
        command_r, command_w = os.pipe()
        reply_r, reply_w = os.pipe()
        host_pid = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python >= 3.12 warns on every fork of a process with threads: a lock another thread
            # held at the fork stays held in the child. The device process takes none the host's
            # threads could hold: it runs torch ops and pickle (CPython re-creates the GIL and the
            # import lock in the child; glibc its malloc locks), never logging or their queues.
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the device process: serve until told to stop, never return
            code = 1
            try:
                os.close(command_w)
                os.close(reply_r)
                for other in list(_live.values()):
                    if other is not self:
                        _close_pipes(other._link)
                code = serve_forever(
                    Device(
                        Connection(command_r, writable=False), Connection(reply_w, readable=False),
                        host_pid, self._objects, inherited, self.chaos,
                    )
                )  # fmt: skip
            finally:
                os._exit(code)
        os.close(command_r)
        os.close(reply_w)
        self._link.pid = pid
        self._link.commands = Connection(command_w, readable=False)
        self._link.replies = Connection(reply_r, writable=False)
        poller = select.poll()
        poller.register(reply_r, select.POLLIN)
        self._replies_ready = lambda: bool(poller.poll(0))  # readable or closed: one poll(2) call

    # -- the stream interface ---------------------------------------------------------------------

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        if self._link.commands is None:
            if self._link.closed:
                raise self._closed_error()
            raise ConfigError("process stream: a task was submitted before start() forked the device process.")
        self._post(b"t" + dumps(_HostPickler, (self._submitted, get_checks_mode(), fn, args), self))
        self._submitted += 1

    def record_event(self) -> _ProcessEvent:
        if self._link.commands is None:
            return _ProcessEvent(self, 0)  # nothing was submitted: passed
        self._post(b"e%d" % self._submitted)
        return _ProcessEvent(self, self._submitted)

    def synchronize(self) -> None:
        self.record_event().synchronize()

    def reset(self) -> None:
        if self._link.commands is not None:
            self._post(b"r")
            self.record_event().wait()
        self._fault = None  # a device process that died stays closed: the next task says so

    def close(self) -> None:
        """Stop the device process (idempotent); the stream cannot run tasks afterwards."""
        _live.pop(id(self), None)
        _shut_down(self._link)

    # -- the host's side of the pipe --------------------------------------------------------------

    def _post(self, message: bytes) -> None:
        """Queue a message; :meth:`_flush` sends the queue as one write. The host flushes whenever
        it is about to wait or look, so a step's copies, device step and events reach the device
        process together — one pipe write and at most one wake-up a step, not one per task."""
        if self._link.owner != os.getpid():
            # Its messages would land in the host's pipe between the host's own.
            raise ConfigError(
                f"process stream: this stream belongs to process {self._link.owner}; a process forked "
                "from it cannot use its device process. Create the LLM in the forked process."
            )
        self._link.outbox.append(len(message).to_bytes(4, "little") + message)

    def _closed_error(self) -> TokenStateError:
        return TokenStateError(f"process stream: closed ({self._link.why_closed}); start a new LLM.")

    def _flush(self) -> None:
        if not self._link.outbox:
            return
        try:
            batch, self._link.outbox = b"".join(self._link.outbox), []
            self._send(batch)
        except BaseException:
            if not self._link.closed:
                # Ctrl-C inside the write (or just before it): how much of the batch went out is
                # unknown, and the device process may wait for the rest forever.
                _abandon(self._link, "interrupted while sending to the device process")
            raise

    def _send(self, message: bytes) -> None:
        if self._link.commands is None:
            raise self._closed_error()
        try:
            self._link.commands.send_bytes(message)
        except OSError as exc:
            _shut_down(self._link)  # reaps it; later calls see a closed stream, not a second error
            raise TokenStateError(
                "process stream: the device process is gone (it crashed or was killed); its "
                "output went to stderr. Start a new LLM."
            ) from exc

    def _drain(self) -> None:
        """Handle every reply already there (never blocks)."""
        self._flush()
        while self._link.replies is not None and self._replies_ready():
            self._handle(self._link.replies)

    def _wait(self, index: int) -> None:
        self._flush()
        spin_until = None
        while self._passed < index:
            if self._link.replies is None:
                raise self._closed_error()
            if self._spin and not self._replies_ready():
                # Poll before sleeping (see host_wait_mode): the answer usually comes within a step.
                now = time.perf_counter()
                if spin_until is None:
                    spin_until = now + self._spin
                if now < spin_until:
                    os.sched_yield()  # a device process sharing this core gets it
                    continue
            self._handle(self._link.replies)

    def _handle(self, replies: Connection) -> None:
        try:
            message = replies.recv_bytes()
        except BaseException as exc:
            if not isinstance(exc, EOFError):
                # Ctrl-C between a reply's header and its body: the pipe is out of step, and the
                # next read would wait for a header that is never coming.
                _abandon(self._link, "interrupted while reading a reply of the device process")
                raise
            _shut_down(self._link)
            raise TokenStateError(
                "process stream: the device process exited (it crashed or was killed); its output "
                "went to stderr. Start a new LLM."
            ) from exc
        kind = message[:1]
        if kind == b"p":  # an event was passed
            self._passed = max(self._passed, int(message[1:]))
            if self._guards:
                for gid in [g for g, (index, _) in self._guards.items() if index < self._passed]:
                    del self._guards[gid]  # its task ran: every record it made has arrived
        elif kind == b"f":  # the first task that failed, sent before the event behind it
            fault_index, fault = pickle.loads(message[1:])
            if self._fault is None:
                self._fault_index, self._fault = fault_index, fault
        elif kind == b"g":  # a guarded embedding's violations, sent right after their task
            gid, records = pickle.loads(message[1:])
            entry = self._guards.get(gid)
            if entry is not None:
                for bad, ids, vocab in records:
                    entry[1].record(bad, ids, vocab)

    def _raise_if_failed(self, before: int) -> None:
        if self._fault is not None and self._fault_index < before:
            raise self._fault


def _shut_down(link: _Link) -> None:
    """Tell the device process to stop, wait for it, close the pipes and shared buffers.

    In a process forked from the host (whose exit runs this too, from ``atexit`` or the stream's
    finalizer) only that process's copies of the pipes and buffers are closed: the device process
    is the host's, and goes on serving it."""
    link.closed = True
    if link.owner != os.getpid():
        link.outbox, link.pid = [], None
        _close_pipes(link)
        return
    if link.commands is not None:
        quit_message = b"q"
        try:
            link.commands.send_bytes(b"".join([*link.outbox, len(quit_message).to_bytes(4, "little"), quit_message]))
        except OSError:
            pass
        link.outbox = []
    _close_pipes(link)
    if link.pid is not None:
        pid, link.pid = link.pid, None
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _abandon(link: _Link, why: str) -> None:
    """Give the device process up at once — its pipe is out of step, so it can be told nothing —
    and say ``why`` in every later call."""
    pid = link.pid
    link.why_closed, link.closed, link.outbox, link.pid = why, True, [], None
    _close_pipes(link)
    if pid is not None and link.owner == os.getpid():
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _close_pipes(link: _Link) -> None:
    for conn in (link.commands, link.replies):
        if conn is not None:
            conn.close()
    link.commands = link.replies = None
    for buffer in link.shared.values():
        buffer.close()
    link.shared = {}
