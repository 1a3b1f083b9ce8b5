"""Large CPU buffers on transparent huge pages.

A step's attention streams every running slot's KV cache once per layer. On 4 KiB pages that read
takes a TLB miss every 4 KiB; on 2 MiB pages one every 2 MiB, and the tiny peer model's workload B
measured 2–5 % faster with its caches on them (*Design notes -> CPU serving speed -> The KV cache
on huge pages*). PyTorch's CPU allocator asks for huge pages only
when the process starts with ``THP_MEM_ALLOC_ENABLE=1``; this module asks for them per buffer, so
an engine gets them whatever its environment, and only for the buffers that pay.

Linux with transparent huge pages in ``always`` or ``madvise`` mode honours the advice; anywhere
else (or for a buffer under one huge page) :func:`huge_page_zeros` is :func:`torch.zeros`.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch
from torch import Tensor

from tokenstate.runtime.prefault import note_lazy_pages

__all__ = ["HUGE_PAGE_BYTES", "HugePageBacking", "huge_page_backing", "huge_page_zeros"]

HUGE_PAGE_BYTES = 2 * 1024 * 1024
"""The x86-64 / arm64 transparent huge page size the mapping is aligned to."""
_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)  # absent off Linux


def huge_page_zeros(*shape: int, dtype: torch.dtype) -> Tensor:
    """A zeroed, contiguous CPU tensor whose memory is advised onto transparent huge pages.

    The memory is an anonymous mapping (zero-filled by the kernel, so nothing is written here),
    advised before its first touch and aligned to :data:`HUGE_PAGE_BYTES`, so the kernel can back
    it with huge pages as the tensor is first written. The tensor keeps the mapping alive. It is
    noted as not yet backed (:func:`tokenstate.runtime.prefault.note_lazy_pages`): an engine faults
    it in when it starts, in the process that will write it. Falls back to :func:`torch.zeros`
    where the advice is unavailable or the buffer is under one huge page.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if _ADVICE is None or nbytes < HUGE_PAGE_BYTES:
        return torch.zeros(*shape, dtype=dtype)
    # One huge page extra, so a 2 MiB-aligned start exists inside the mapping.
    # Private: Python's default anonymous mapping is shared memory, which transparent huge pages skip.
    try:
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # no address space for the extra page: torch's allocator raises its own error
        return torch.zeros(*shape, dtype=dtype)
    try:
        mapping.madvise(_ADVICE)
    except OSError:  # a kernel built without transparent huge pages: plain pages, same contents
        pass
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # shares the mapping and holds a reference
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    tensor = raw[start : start + nbytes].view(dtype).view(shape)
    note_lazy_pages(tensor)
    return tensor


@dataclass(frozen=True, slots=True)
class HugePageBacking:
    """How the kernel maps a tensor's memory now (read from ``/proc/self/smaps``)."""

    advised: bool  # every mapping the tensor spans carries the huge-page advice ("hg")
    huge_bytes: int  # of those mappings' memory, how much sits on huge pages


def huge_page_backing(tensor: Tensor) -> HugePageBacking:
    """Whether ``tensor``'s memory is advised onto huge pages and how much of it they back now.

    For tests and benchmarks that check the advice took effect; ``HugePageBacking(False, 0)``
    where ``/proc/self/smaps`` cannot be read (not Linux).
    """
    lo = tensor.data_ptr()
    hi = lo + max(tensor.untyped_storage().nbytes(), 1)
    try:
        with open("/proc/self/smaps") as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return HugePageBacking(False, 0)
    spanned, advised, huge, inside = 0, 0, 0, False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):  # a mapping's header: "start-end perms offset ..."
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start < hi and lo < end
            spanned += inside
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1]) * 1024
        elif inside and head == "VmFlags:":
            advised += "hg" in line.split()[1:]
    return HugePageBacking(bool(spanned) and advised == spanned, huge)
