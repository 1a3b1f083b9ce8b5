"""Slot state faulted in at engine start: noted lazily mapped buffers, backed where they are written."""

from __future__ import annotations

import mmap
import resource
import sys

import pytest
import torch
from torch import nn

from tokenstate.models.cpu_memory import HUGE_PAGE_BYTES, huge_page_zeros
from tokenstate.runtime import LLM, SamplingParams, prefault
from tokenstate.runtime.prefault import fault_in_lazy_pages, lazy_page_bytes

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="lazily mapped buffers come from Linux's transparent huge page advice",
)

_MIB = 2**20


class _Holder(nn.Module):
    """A module holding slot state the way attention layers do: a plain tensor attribute."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.cache = huge_page_zeros(nbytes // 4, dtype=torch.float32)  # [nbytes / 4]


def _faults_to_write(t: torch.Tensor) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.inference_mode():  # an engine's caches are inference tensors
        t.fill_(2.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "write-each-page"])
def test_a_faulted_in_buffer_is_written_without_page_faults_and_keeps_its_values(
    populate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not populate:  # a kernel before 5.14 (or no C library): each page is written once instead
        monkeypatch.setattr(prefault, "_populate", lambda tensor: False)
    cold, warm = _Holder(64 * _MIB), _Holder(64 * _MIB)
    warm.cache[123] = 7.0
    warm.cache[-1] = -0.0
    assert lazy_page_bytes(warm) == 64 * _MIB
    assert fault_in_lazy_pages(warm) == 64 * _MIB
    assert lazy_page_bytes(warm) == 0 and fault_in_lazy_pages(warm) == 0  # forgotten once backed
    assert warm.cache[123].item() == 7.0 and str(warm.cache[-1].item()) == "-0.0"
    assert warm.cache.count_nonzero().item() == 1
    # 64 MiB unbacked: at least 32 faults on huge pages (16,384 on 4 KiB pages); backed: none.
    assert _faults_to_write(cold.cache) >= 64 * _MIB // HUGE_PAGE_BYTES
    assert _faults_to_write(warm.cache) < 8


def test_only_the_buffers_the_root_holds_are_faulted_in() -> None:
    mine, other = _Holder(4 * _MIB), _Holder(4 * _MIB)
    plain = nn.Linear(4, 4)
    assert fault_in_lazy_pages(mine) == 4 * _MIB
    assert lazy_page_bytes(other) == 4 * _MIB  # another model's state stays unbacked
    assert lazy_page_bytes(plain) == 0 and fault_in_lazy_pages(object()) == 0


def test_without_madvise_an_engine_still_backs_its_kv_caches_when_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # With MADV_POPULATE_WRITE, spec item CPU-6 (specs/cpu-serving.md) covers the engine.
    monkeypatch.setattr(prefault, "_populate", lambda tensor: False)
    llm = LLM("tiny-llama", max_num_seqs=8)  # each cache 2 MiB: lazily mapped
    attention = llm.model.model.layers[0].self_attn
    assert attention.k_cache.nbytes >= HUGE_PAGE_BYTES
    assert lazy_page_bytes(llm.model) == 0
    assert _faults_to_write(attention.k_cache) < 4
    assert len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids) == 3
