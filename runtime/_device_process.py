"""The device process's side of :mod:`tokenstate.runtime.process_stream`: run the host's tasks in
order on the device's copies of the runner, the mirror and the model; answer events; send faults and
guarded-embedding violations back.

The host pickles a task with references to what the fork gave both processes (objects by identity,
views of their device buffers by attribute and offset, shared host buffers by key); the functions
here resolve those references in the device process. None of them may run in the host process.
"""

from __future__ import annotations

import copyreg
import io
import mmap
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from tokenstate.contracts import TokenStateError, get_checks_mode, set_checks_mode
from tokenstate.runtime.kernels.guard import StepGuard
from tokenstate.runtime.stream import Chaos

# Internal: the host's side, and the public stream, is tokenstate.runtime.process_stream.
__all__ = [
    "Device", "DevicePickler", "RequestOnDevice", "allocate", "device_guard", "device_object", "device_view",
    "dumps", "serve_forever", "shared_view", "tensor_by_value",
]  # fmt: skip


class RequestOnDevice:
    """What a device task reads of a :class:`~tokenstate.runtime.request.Request`: its parameters."""

    __slots__ = ("params", "request_id", "slot")

    def __init__(self, params: Any, request_id: int, slot: int) -> None:
        self.params, self.request_id, self.slot = params, request_id, slot


class DevicePickler(pickle.Pickler):
    """Pickles what the device process sends back; tensors as numpy arrays."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = _DEVICE_DISPATCH


def tensor_by_value(t: torch.Tensor) -> Any:
    return torch.from_numpy, (t.detach().numpy(force=True).copy(),)


_DEVICE_DISPATCH: dict[type, Callable[[Any], Any]] = {**copyreg.dispatch_table, torch.Tensor: tensor_by_value}


_here: Device | None = None
"""The device process's :class:`Device` (``None`` in the host process)."""


def on_device() -> Device:
    if _here is None:
        raise TokenStateError("process stream: a device reference was unpickled outside the device process.")
    return _here


def device_object(oid: int) -> object:
    return on_device().objects[oid]


def device_guard(gid: int) -> StepGuard:
    guard = StepGuard()
    on_device().task_guards.append((gid, guard))
    return guard


def device_view(
    owner: tuple[int, str], dtype: torch.dtype, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]
) -> torch.Tensor:
    oid, name = owner
    return _view(getattr(on_device().objects[oid], name), dtype, offset, shape, stride)


def shared_view(
    key: int, dtype: torch.dtype, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]
) -> torch.Tensor:
    return _view(on_device().shared_tensor(key), dtype, offset, shape, stride)


def _view(base: torch.Tensor, dtype: torch.dtype, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    if base.dtype != dtype:
        raise TokenStateError(f"process stream: a {dtype} view of a {base.dtype} buffer cannot travel.")
    return base.as_strided(shape, stride, offset)


def dumps(pickler: type[pickle.Pickler], obj: Any, *args: Any) -> bytes:
    buf = io.BytesIO()
    pickler(buf, *args).dump(obj)
    return buf.getvalue()


def portable(exc: BaseException) -> BaseException:
    """The exception as it can cross to the host: itself when it pickles, else a TokenStateError."""
    try:
        pickle.loads(dumps(DevicePickler, exc))
        copy = exc
    except Exception:
        copy = TokenStateError(f"{type(exc).__name__}: {exc}")
    note = "".join(traceback.format_exception(exc))
    copy.add_note(f"raised in the device process (process stream):\n{note}")
    return copy


class Device:
    """The device process's side: runs tasks in order, answers events."""

    def __init__(
        self, commands: Connection, replies: Connection, host_pid: int, objects: dict[int, object],
        inherited: dict[int, torch.Tensor], chaos: Chaos | None,
    ) -> None:  # fmt: skip
        self.commands, self.replies, self.host_pid = commands, replies, host_pid
        self.objects = objects
        # Shared host buffers: those made before the fork are mapped here already; a later one is
        # announced (fd, bytes, dtype, numel) and opened on first use.
        self._shared: dict[int, torch.Tensor] = dict(inherited)
        self._shared_meta: dict[int, tuple[int, int, torch.dtype, int]] = {}
        self._maps: list[mmap.mmap] = []
        self.chaos = chaos
        self.task_guards: list[tuple[int, StepGuard]] = []
        self.fault: BaseException | None = None
        self.fault_index = 0
        self.fault_sent = True

    def shared_tensor(self, key: int) -> torch.Tensor:
        tensor = self._shared.get(key)
        if tensor is None:
            fd, nbytes, dtype, numel = self._shared_meta[key]
            opened = os.open(f"/proc/{self.host_pid}/fd/{fd}", os.O_RDWR)
            try:
                mapped = mmap.mmap(opened, nbytes)
            finally:
                os.close(opened)
            self._maps.append(mapped)
            tensor = self._shared[key] = torch.frombuffer(mapped, dtype=dtype, count=numel)
        return tensor

    def serve(self) -> None:
        while True:
            try:
                batch = self.commands.recv_bytes()
            except EOFError:
                return
            view, at = memoryview(batch), 0
            while at < len(batch):
                size = int.from_bytes(view[at : at + 4], "little")
                if not self._handle(bytes(view[at + 4 : at + 4 + size])):
                    return
                at += 4 + size

    def _handle(self, message: bytes) -> bool:
        """Act on one message; ``False`` once told to stop."""
        kind = message[:1]
        if kind == b"t":
            self._run(message[1:])
        elif kind == b"e":
            if not self.fault_sent and self.fault is not None:
                self.fault_sent = True
                self.replies.send_bytes(b"f" + dumps(DevicePickler, (self.fault_index, self.fault)))
            self.replies.send_bytes(b"p" + message[1:])  # passed: the event's index, as ASCII digits
        elif kind == b"s":  # a shared buffer the host made after the fork
            key, meta = pickle.loads(message[1:])
            self._shared_meta[key] = meta
        elif kind == b"r":
            self.fault, self.fault_sent = None, True
        elif kind == b"q":
            return False
        return True

    def _run(self, payload: bytes) -> None:
        if self.chaos is not None:
            delay = self.chaos.stream_delay()
            if delay:
                time.sleep(delay)
        self.task_guards = []
        try:
            index, checks, fn, args = pickle.loads(payload)
        except BaseException as exc:
            self._fail(-1, exc)
            return
        if self.fault is not None:
            return  # poisoned until reset, as the other streams
        try:
            if checks != get_checks_mode():
                set_checks_mode(checks)
            fn(*args)
        except BaseException as exc:
            self._fail(index, exc)
        self._send_guard_records()

    def _fail(self, index: int, exc: BaseException) -> None:
        if self.fault is None:
            self.fault, self.fault_index, self.fault_sent = portable(exc), index, False

    def _send_guard_records(self) -> None:
        for gid, guard in self.task_guards:
            # The device reading its own flags is no host sync; only violations travel back.
            bad = [(r.bad, r.ids, r.vocab_size) for r in guard._records if bool(r.bad.any())]
            if bad:
                self.replies.send_bytes(b"g" + dumps(DevicePickler, (gid, bad)))
        self.task_guards = []


def serve_forever(device: Device) -> int:
    """The device process's life: serve the host's tasks until it stops; the exit status."""
    global _here
    _here = device
    # Ctrl-C interrupts the host, which then stops this process (or its pipe closes): a device
    # interrupted mid-task would only leave the host a half-run step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            device.serve()
    except BrokenPipeError:
        # An answer found the reply pipe closed: the host closed the stream (or exited) while this
        # process still ran what it had been sent. Nobody waits for an answer any more; a task's own
        # errors never get here (_run keeps them), so this is the quiet end of a closing host.
        return 0
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def allocate(owner: object, name: str, numel: int, dtype: torch.dtype) -> None:
    """On the device: :meth:`ProcessStream.device_buffer`'s allocation."""
    setattr(owner, name, torch.empty(numel, dtype=dtype))


