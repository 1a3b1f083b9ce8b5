"""The slot state sized against the machine's memory: too much is a ConfigError naming what to lower."""

from __future__ import annotations

import pytest

from tokenstate.contracts import ConfigError
from tokenstate.models.cpu_memory import HUGE_PAGE_BYTES
from tokenstate.runtime import LLM, SamplingParams, slot_memory
from tokenstate.runtime.scheduler import Scheduler
from tokenstate.runtime.slot_memory import available_memory_bytes, slot_state_allocation


def test_more_slots_than_the_kernel_will_map_is_a_config_error_naming_max_num_seqs() -> None:
    # 10^7 slots of 1,024 positions: the host token table alone is 38 GiB of int32, which numpy
    # refuses at once (a MemoryError from inside the engine before).
    with pytest.raises(ConfigError, match=r"max_num_seqs=10000000 does not fit in memory.*lower max_num_seqs"):
        LLM("tiny-llama", max_num_seqs=10**7)


def test_an_oversized_engine_is_refused_before_the_scheduler_lists_its_slots(monkeypatch) -> None:
    # The scheduler keeps a list of every free slot: 10^9 of them is 36 GB of Python ints, which
    # got the process killed (or a bare MemoryError) before the slot state's own check could say
    # which setting to lower. The runner sizes the slot state first, so nothing is listed.
    listed = []
    original = Scheduler.__init__

    def recording_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        listed.append(kwargs.get("max_num_seqs"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "__init__", recording_init)
    with pytest.raises(ConfigError, match=r"max_num_seqs=100000000 does not fit in memory"):
        LLM("tiny-llama", max_num_seqs=10**8)  # (10^8 keeps the list a test of the old order could build)
    assert listed == []


def test_a_failed_torch_allocation_is_a_config_error_and_other_runtime_errors_pass() -> None:
    failure = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"
    with pytest.raises(ConfigError, match="does not fit in memory") as raised:
        with slot_state_allocation(4, 128):
            raise RuntimeError(failure)
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with slot_state_allocation(4, 128):
            raise RuntimeError("shape mismatch")


def test_kv_caches_beyond_the_available_memory_are_refused_before_any_page_is_backed(monkeypatch) -> None:
    sized = LLM("tiny-llama", max_num_seqs=64)  # caches of 2 MiB and more: lazily mapped
    need = sum(
        cache.nbytes for layer in sized._engine.runner.model.model.layers for cache in layer.self_attn.caches()
    )
    assert need >= 2 * HUGE_PAGE_BYTES
    monkeypatch.setattr(slot_memory, "available_memory_bytes", lambda: need - 1)
    faulted = []
    monkeypatch.setattr("tokenstate.runtime.runner.fault_in_lazy_pages", faulted.append)
    with pytest.raises(ConfigError, match=r"KV caches for max_num_seqs=64 need .* GiB .* a slot\) but .* available"):
        LLM("tiny-llama", max_num_seqs=64)
    assert not faulted  # refused before the engine's first task
    monkeypatch.setattr(slot_memory, "available_memory_bytes", lambda: need)
    out = LLM("tiny-llama", max_num_seqs=64).generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert len(out[0].token_ids) == 2


def test_the_available_memory_is_read_from_the_kernel_where_it_says() -> None:
    available = available_memory_bytes()
    assert available is None or available > 0



def test_weights_that_fail_to_allocate_are_a_config_error_naming_the_model(monkeypatch) -> None:
    """A config whose sizes are far beyond its checkpoint's allocates the whole model before the
    shapes are compared: a failed allocation there says which model and what to check."""
    import tokenstate.runtime.llm as llm_module

    def failing_build(model, device):  # what torch's CPU allocator raises for memory it cannot map
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: not enough memory: you "
            "tried to allocate 8589934592 bytes."
        )

    monkeypatch.setattr(llm_module, "_build_or_load", failing_build)
    with pytest.raises(ConfigError, match=r"the weights '/models/typo' describes do not fit in memory .* check the sizes"):
        LLM("/models/typo")

    def other_error(model, device):
        raise RuntimeError("some kernel failed")

    monkeypatch.setattr(llm_module, "_build_or_load", other_error)
    with pytest.raises(RuntimeError, match="some kernel failed"):  # not an allocation: untouched
        LLM("tiny-llama")


def test_a_step_budget_too_large_for_memory_is_a_config_error_naming_max_num_batched_tokens(monkeypatch) -> None:
    # The device mirror stages ids and metadata for max_num_batched_tokens tokens a step; its
    # failing allocation blamed max_num_seqs, which lowering cannot fix.
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise MemoryError("cannot allocate 51539607552 bytes")

    monkeypatch.setattr("tokenstate.runtime.runner.DeviceMirror", refuse)
    with pytest.raises(ConfigError, match=(
        r"max_num_batched_tokens=2147483647 .* do not fit in memory.*lower max_num_batched_tokens .*"
        r"more than max_num_seqs x max_model_len = 2048 .* never used"
    )):
        LLM("tiny-llama", max_num_seqs=2, max_num_batched_tokens=2**31 - 1)
