"""CPU buffers advised onto transparent huge pages: the KV caches attention streams every step."""

from __future__ import annotations

import gc
import mmap
import sys

import pytest
import torch

from tokenstate.models.cpu_memory import HUGE_PAGE_BYTES, huge_page_backing, huge_page_zeros
from tokenstate.models.llama import FACTORY

linux_advice = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="transparent huge page advice is a Linux madvise",
)


def test_a_huge_page_buffer_is_zeroed_contiguous_aligned_and_outlives_its_mapping() -> None:
    shape = (4, 2, 1024, 64)  # 2 MiB of float32: one huge page
    t = huge_page_zeros(*shape, dtype=torch.float32)
    assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    assert not t.any()
    gc.collect()  # only the tensor holds the mapping now
    t[3, 1, -1, -1] = 7.0
    t[0].fill_(1.0)
    assert t.sum().item() == 7.0 + t[0].numel()
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert t.data_ptr() % HUGE_PAGE_BYTES == 0


@linux_advice
def test_a_buffer_of_a_huge_page_or_more_is_advised_and_a_smaller_one_is_plain() -> None:
    big = huge_page_zeros(HUGE_PAGE_BYTES // 4, dtype=torch.float32)
    small = huge_page_zeros(HUGE_PAGE_BYTES // 4 - 1, dtype=torch.float32)
    assert huge_page_backing(big).advised
    assert not huge_page_backing(small).advised
    assert not huge_page_backing(torch.zeros(HUGE_PAGE_BYTES // 4)).advised


@linux_advice
def test_a_cpu_models_kv_caches_are_advised_onto_huge_pages() -> None:
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(64)  # big enough that each cache spans a huge page
    attention = model.model.layers[0].self_attn
    for cache in (attention.k_cache, attention.v_cache):
        assert cache.untyped_storage().nbytes() >= HUGE_PAGE_BYTES
        assert huge_page_backing(cache).advised
