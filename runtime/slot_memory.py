"""The engine's slot state sized against the memory there is: a clear error, not a killed process.

An engine allocates its per-slot state once, at start: the host token table and the mirror
(``[max_num_seqs, max_model_len]`` each) and the model's KV caches (``allocate_slots``). Asked for
more than the machine has, two things used to happen, neither of them an error a user can act on:

* an allocation larger than the kernel will map failed at once, as numpy's ``MemoryError`` or
  torch's ``RuntimeError("DefaultCPUAllocator: can't allocate memory ...")`` from deep inside;
* a CPU model's KV caches are mapped lazily (:func:`tokenstate.models.cpu_memory.huge_page_zeros`)
  and backed by the engine's first device task (:mod:`tokenstate.runtime.prefault`), so caches
  larger than the free memory mapped fine and the kernel's out-of-memory killer then ended the
  process (or the device process) at that first task.

:func:`slot_state_allocation` turns the first into a :class:`~tokenstate.contracts.ConfigError`
that names the setting to lower, and :func:`check_slot_state_fits` refuses the second before any
page is touched: the lazily mapped bytes against ``MemAvailable`` (Linux; elsewhere nothing is
checked and the allocator's own error stands).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from tokenstate.contracts import ConfigError
from tokenstate.runtime.prefault import lazy_page_bytes

__all__ = [
    "available_memory_bytes",
    "check_slot_state_fits",
    "model_allocation",
    "slot_state_allocation",
    "step_state_allocation",
]

_GIB = 1 << 30
# torch's CPU allocator reports a failed allocation as a plain RuntimeError; these name it.
_CPU_ALLOCATOR_FAILURES = ("can't allocate memory", "not enough memory")


def available_memory_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (``MemAvailable``); ``None``
    where ``/proc/meminfo`` does not say (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _advice(max_num_seqs: int, max_model_len: int) -> str:
    return (
        f"lower max_num_seqs (now {max_num_seqs}: every slot holds state for max_model_len="
        f"{max_model_len} tokens), or serve a checkpoint whose config has a smaller "
        "max_position_embeddings"
    )


def _failed_allocation(exc: BaseException) -> bool:
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and any(failure in str(exc) for failure in _CPU_ALLOCATOR_FAILURES)
    )


@contextlib.contextmanager
def _failed_allocation_refused(describe: Callable[[BaseException], str]) -> Iterator[None]:
    """Around an allocation: one that fails becomes a :class:`ConfigError` saying ``describe(exc)``;
    any other error passes."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not _failed_allocation(exc):
            raise
        raise ConfigError(describe(exc)) from exc


def slot_state_allocation(max_num_seqs: int, max_model_len: int) -> contextlib.AbstractContextManager[None]:
    """Around the slot state's allocation: a failed allocation becomes a :class:`ConfigError`."""
    return _failed_allocation_refused(lambda exc: (
        f"LLM: the slot state for max_num_seqs={max_num_seqs} does not fit in memory ({exc}); "
        f"{_advice(max_num_seqs, max_model_len)}."
    ))


def step_state_allocation(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
) -> contextlib.AbstractContextManager[None]:
    """Around the device mirror's allocation, which stages ids and metadata for up to
    ``max_num_batched_tokens`` tokens a step besides each slot's state: a failed allocation becomes
    a :class:`ConfigError` naming the step budget first."""
    return _failed_allocation_refused(lambda exc: (
        f"LLM: the step buffers for max_num_batched_tokens={max_num_batched_tokens} and the slot "
        f"state for max_num_seqs={max_num_seqs} do not fit in memory ({exc}); lower "
        f"max_num_batched_tokens (a step stages ids for that many tokens; more than max_num_seqs x "
        f"max_model_len = {max_num_seqs * max_model_len} is never used), or {_advice(max_num_seqs, max_model_len)}."
    ))


def model_allocation(source: str) -> contextlib.AbstractContextManager[None]:
    """Around building or loading a model: its weights failing to allocate (a config whose sizes
    are far beyond its checkpoint's, say) become a :class:`ConfigError` naming ``source``."""
    return _failed_allocation_refused(lambda exc: (
        f"LLM: the weights {source} describes do not fit in memory ({exc}); check the sizes in "
        "its config (hidden_size, intermediate_size, vocab_size, num_hidden_layers) against "
        "the model you mean to serve."
    ))


def check_slot_state_fits(model: object, max_num_seqs: int, max_model_len: int) -> None:
    """Refuse (:class:`ConfigError`) a model whose lazily mapped slot state outgrows the memory
    available now, before the engine's first task backs it (and the kernel kills the process)."""
    need = lazy_page_bytes(model)
    available = available_memory_bytes()
    if available is None or need <= available:
        return
    raise ConfigError(
        f"LLM: the model's KV caches for max_num_seqs={max_num_seqs} need {need / _GIB:.1f} GiB "
        f"({need // max_num_seqs / (1 << 20):.1f} MiB a slot) but this machine has "
        f"{available / _GIB:.1f} GiB available; backing them would get the process killed. "
        f"{_advice(max_num_seqs, max_model_len).capitalize()}."
    )
