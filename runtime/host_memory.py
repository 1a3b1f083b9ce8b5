"""glibc's malloc told to keep a step's freed buffers, instead of handing them back to the kernel.

A CPU step allocates and frees the same activation buffers every step (a prefill's gate/up output
alone is several MiB). glibc serves a block above its mmap threshold with a fresh mapping and unmaps
it on free, and returns free memory at the top of its heap to the kernel once it exceeds the trim
threshold; both thresholds adapt to the sizes freed so far, so after most steps some of next
step's buffers come back as new pages, each zeroed by the kernel on its first touch. On the tiny
peer model's workload B that was ~30,000 page faults a run and 3-5 % of its time (*Design notes ->
CPU serving speed -> Freed memory kept in the process*). vLLM's CPU engine avoids it by preloading
tcmalloc into its engine process; this module tunes the allocator that is already there.

:func:`retain_freed_memory` (called by the engine on a CPU device) fixes the mmap threshold at
glibc's largest (32 MiB: bigger blocks still get their own mapping) and the trim threshold at
1 GiB, so the process keeps what a step freed for the next one. The process's resident memory then
stays at its peak instead of shrinking between steps. It is process-wide and one-way (glibc has no
call to restore the adaptive thresholds), so ``TOKENSTATE_CPU_MALLOC=system`` leaves malloc alone.
Without glibc (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading

from tokenstate.contracts import validated_setting

__all__ = [
    "CPU_MALLOC_ENV",
    "CPU_MALLOC_MODES",
    "MMAP_THRESHOLD_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "freed_memory_retained",
    "retain_freed_memory",
]

CPU_MALLOC_ENV = "TOKENSTATE_CPU_MALLOC"
CPU_MALLOC_MODES: tuple[str, ...] = ("retain", "system")
MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Blocks up to this size come from the heap (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit)."""
TRIM_THRESHOLD_BYTES = 2**30
"""Free memory at the top of the heap is returned to the kernel only beyond this."""

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_lock = threading.Lock()
_retained = False


def retain_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds so freed step buffers stay in the process.

    Returns whether they are set (now or by an earlier call). ``False`` with
    ``TOKENSTATE_CPU_MALLOC=system`` and where the C library is not glibc; a
    :class:`~tokenstate.contracts.ConfigError` for any other value of that variable.
    """
    global _retained
    mode = validated_setting(
        os.environ.get(CPU_MALLOC_ENV, "retain"), CPU_MALLOC_ENV, CPU_MALLOC_MODES,
        what="CPU malloc mode", default="retain, which keeps freed step buffers in the process",
    )  # fmt: skip
    if mode == "system":
        return _retained
    with _lock:
        if not _retained:
            libc = _glibc()
            _retained = (
                libc is not None
                and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
            )
    return _retained


def freed_memory_retained() -> bool:
    """Whether :func:`retain_freed_memory` has set glibc's thresholds in this process."""
    return _retained


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
