"""Mutants of the stream-fences spec: each drops exactly one fence the CPU stream makes real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "STR-1/staging-reused-in-flight",
    doc="The staging buffers stop alternating and the host rewrites the one buffer without waiting "
    "on the event of its last copy: a step's inputs are overwritten by the next step's while the "
    "stream has not copied them yet.",
)
def staging_reused_in_flight(patch: MutantPatch) -> None:
    from tokenstate.runtime.mirror import _Staging

    patch.setattr(_Staging, "_writable", lambda self: 0)


@mutant(
    "STR-2/pending-read-unfenced",
    doc="Resolving a step reads the host result buffer without waiting on the event recorded "
    "after its copy: the host takes whatever the buffer held (an older step's tokens).",
)
def pending_read_unfenced(patch: MutantPatch) -> None:
    from tokenstate.runtime.mirror import PendingTokens

    def resolve_without_fence(self: PendingTokens) -> Any:
        self._guard.raise_if_violated(self._layout)
        return self._host.numpy()

    patch.setattr(PendingTokens, "resolve", resolve_without_fence)


class _HostSide:
    """A stand-in stream that runs a task at once, on the host thread, out of stream order."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def submit(self, fn: Any, *args: Any) -> None:
        fn(*args)


@mutant(
    "STR-3/reseed-from-host",
    doc="Admission writes a reused slot's history, last sampled token and counters from the host "
    "at once instead of in stream order, so the in-flight step of the slot's previous occupant "
    "still reads and writes them afterwards.",
)
def reseed_from_host(patch: MutantPatch) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    admit = DeviceMirror.admit

    def admit_from_host(self: DeviceMirror, requests: Any) -> None:
        stream, self.stream = self.stream, _HostSide(self.device)
        try:
            admit(self, requests)
        finally:
            self.stream = stream

    patch.setattr(DeviceMirror, "admit", admit_from_host)


MUTANTS = (staging_reused_in_flight, pending_read_unfenced, reseed_from_host)


@mutant(
    "STR-6/host-buffers-private",
    doc="The device process's host buffers (upload staging, step results) are ordinary host memory "
    "instead of memory both processes map: the device copies the host's inputs as they were when "
    "the task was pickled, and writes each step's tokens where the host never looks.",
)
def host_buffers_private(patch: MutantPatch) -> None:
    from tokenstate.runtime.process_stream import ProcessStream

    patch.setattr(ProcessStream, "host_buffer", lambda self, numel, dtype: torch.zeros(numel, dtype=dtype))


_RUN_BEFORE = Path(__file__).resolve().parent / "recorded_before" / "async_vs_sync.json"
"""``benchmarks/results.json``'s async_vs_sync rows as recorded before STR-5 and STR-7 were met."""


def _read_the_run_before(patch: MutantPatch) -> None:
    from . import _recorded

    patch.setattr(_recorded, "RESULTS", _RUN_BEFORE)


@mutant(
    "STR-5/recorded-run-before",
    doc="The recorded run is the one before the target was met (44c1034, 2026-12-06 15:11 UTC: the "
    "inline workload time async / sync 1.021, before a decode step's stale-position mask became "
    "the spliced-row flags): what the test reads while async scheduling still costs over 2 %.",
)
def str5_recorded_run_before(patch: MutantPatch) -> None:
    _read_the_run_before(patch)


@mutant(
    "STR-7/recorded-run-before",
    doc="The recorded run is the one before the target was met (44c1034, 2026-12-06 15:11 UTC: "
    "async on the device process 1.109x the synchronous engine inline on tiny-llama): what the test "
    "reads while the device process's hand-overs eat the overlap.",
)
def str7_recorded_run_before(patch: MutantPatch) -> None:
    _read_the_run_before(patch)
