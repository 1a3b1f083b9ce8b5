"""Slot state faulted in when the engine starts, not when the first requests write it.

A CPU model's KV caches are anonymous mappings advised onto transparent huge pages
(:func:`tokenstate.models.cpu_memory.huge_page_zeros`): nothing is written when they are made, and
the kernel backs each page at its first write. Left to that first write, the cost fell on the first
requests an engine served: each new slot's prefill wrote its caches' pages for the first time, and
the big peer model's first run after the warm-up took 6.9 s against 5.8 for the runs after it
(14,500 page faults and 1.1 s of kernel time in its first step, on transparent huge pages with
``defrag=madvise``, where a fault may compact memory first). vLLM's CPU engine pays this once, at
start, by allocating and zeroing its KV cache; so does tokenstate, without writing the bytes.

The allocator notes such a buffer (:func:`note_lazy_pages`). The model runner's first device task
calls :func:`fault_in_lazy_pages` on its model: every noted buffer the model holds is faulted in
(``MADV_POPULATE_WRITE``, Linux 5.14+; elsewhere one write of each page's first element, which
keeps its value) and forgotten. The task runs in the process that owns the device state — the
engine's own, or the device process of ``cpu_stream="process"``, which was forked before anything
wrote the caches, so the host's copies stay unbacked and cost it no memory.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import weakref
from typing import Any

import torch

__all__ = ["fault_in_lazy_pages", "lazy_page_bytes", "note_lazy_pages"]

_MADV_POPULATE_WRITE = 23  # <linux/mman.h>, since Linux 5.14 (Python's mmap module has no name for it)
_lazy: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
"""Buffers whose pages the kernel backs at first write, by ``id`` (a tensor's ``==`` is elementwise,
so no set of tensors), until they are faulted in or collected."""


def note_lazy_pages(tensor: torch.Tensor) -> None:
    """Record that ``tensor`` (contiguous, in a fresh anonymous mapping) is backed only as it is written."""
    _lazy[id(tensor)] = tensor


def lazy_page_bytes(root: object) -> int:
    """Bytes of noted buffers that ``root`` (an ``nn.Module``) holds and nothing has faulted in yet."""
    return sum(t.nbytes for t in _held(root))


def fault_in_lazy_pages(root: object) -> int:
    """Back every noted buffer ``root`` holds with memory now; returns the bytes faulted in.

    Values are unchanged. Call it where the buffers will be written: in a device process, its own
    copies are backed and the host's are not.
    """
    held = _held(root)
    for tensor in held:
        if not _populate(tensor):
            _write_each_page(tensor)
        _lazy.pop(id(tensor), None)
    return sum(t.nbytes for t in held)


def _held(root: object) -> list[torch.Tensor]:
    """Noted buffers among the tensor attributes and buffers of ``root``'s modules."""
    if not isinstance(root, torch.nn.Module) or not _lazy:
        return []
    held: dict[int, torch.Tensor] = {}
    for module in root.modules():
        for value in (*vars(module).values(), *module._buffers.values()):
            if isinstance(value, torch.Tensor) and _lazy.get(id(value)) is value:
                held[id(value)] = value
    return list(held.values())


def _populate(tensor: torch.Tensor) -> bool:
    """``madvise(MADV_POPULATE_WRITE)`` over the tensor's pages; False where the kernel lacks it."""
    libc = _libc()
    if libc is None:
        return False
    start = tensor.data_ptr() - tensor.data_ptr() % mmap.PAGESIZE
    end = tensor.data_ptr() + tensor.nbytes
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_POPULATE_WRITE) == 0


def _write_each_page(tensor: torch.Tensor) -> None:
    """Fault in by writing each page's first element back to itself (any dtype, any values)."""
    step = max(1, mmap.PAGESIZE // tensor.element_size())
    with torch.inference_mode():  # an engine's caches are inference tensors, written in place here
        firsts = tensor.view(-1)[::step]  # [ceil(numel / step)], one element per page (contiguous)
        firsts.copy_(firsts.clone())


@functools.cache
def _libc() -> Any:
    """The C library's ``madvise``, looked up once; None where there is no C library to ask (Windows)."""
    try:
        handle = ctypes.CDLL(None, use_errno=True)
        handle.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        handle.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # then each page is written instead
        return None
    return handle
