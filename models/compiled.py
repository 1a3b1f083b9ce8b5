"""The dense decoder stack as one inductor graph, with projections and attention left opaque.

``LLM(compile=True)`` (or ``model.compile_layers()``) runs a dense model's layer loop through
``torch.compile``: inductor fuses each layer's norms, rotary rotation, SiLU·up and residual adds
into a few loops, where eager PyTorch pays a dispatch per small op (on the tiny peer model that is
most of a decode step outside the GEMMs and attention). Two things must keep running our own code:

* the projections' weights: a GEMM traced with its weight as a constant would keep the copy it
  was traced with after an in-place update. A :class:`~tokenstate.models.fused_linear.FusedProjection`
  on the ``torch.mm`` path is traced reading its transposed copy as a graph input, and the model
  re-checks every projection (``prepare``) before each compiled call; a packed (oneDNN) or unwatched
  one runs as one opaque custom op (``tokenstate::opaque_call``, about 40 µs of dispatch a call)
  that calls the projection eagerly;
* slot attention, whose runs of slots are Python metadata of the step (``SlotBatch``): traced, every
  new run structure would be a recompilation. It is one opaque op, reading the step's
  ``SlotBatch`` from a thread-local step context (:func:`attention_step`) set around the compiled
  call.

Registration (:func:`register_opaque`) hands out an integer id per call site, kept in the module
as an int attribute the graph reads as a constant; the registry holds only weak references, so a
freed model frees its weights.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractViolation

__all__ = ["attention_step", "compile_available", "current_attention_batch", "opaque_call", "register_opaque"]


@dataclass(frozen=True, slots=True)
class _Call:
    """One registered call site: ``fn(objects, inputs)`` with the objects held weakly."""

    refs: tuple[weakref.ref, ...]
    fn: Callable[[tuple[Any, ...], list[Tensor]], Tensor]
    name: str


_CALLS: list[_Call] = []  # append-only: an id is an index, never reused
_STEP = threading.local()  # .batch: the SlotBatch of the step this thread is running


def register_opaque(name: str, fn: Callable[[tuple[Any, ...], list[Tensor]], Tensor], *objects: Any) -> int:
    """A new call id: inside a compiled graph, ``opaque_call(id, inputs, ...)`` runs ``fn(objects, inputs)``.

    ``fn`` must not hold the objects itself (pass them here, held weakly) and must return a new
    tensor, never a view of an input.
    """
    _CALLS.append(_Call(tuple(weakref.ref(o) for o in objects), fn, name))
    return len(_CALLS) - 1


@torch.library.custom_op("tokenstate::opaque_call", mutates_args=())
def _opaque_call(inputs: list[Tensor], call_id: int, tail: list[int]) -> Tensor:
    call = _CALLS[call_id]
    objects = tuple(ref() for ref in call.refs)
    if any(o is None for o in objects):
        raise ContractViolation(f"compiled call {call.name!r} outlived the module it calls; compile the model again.")
    return call.fn(objects, inputs)


@_opaque_call.register_fake
def _opaque_call_shape(inputs: list[Tensor], call_id: int, tail: list[int]) -> Tensor:
    return inputs[0].new_empty(inputs[0].shape[0], *tail)  # [num_tokens, *tail]


def opaque_call(call_id: int, inputs: Sequence[Tensor], tail: Sequence[int]) -> Tensor:
    """``[inputs[0].shape[0], *tail]``: registered call ``call_id`` on ``inputs``, opaque to inductor."""
    return torch.ops.tokenstate.opaque_call(list(inputs), call_id, list(tail))


@contextlib.contextmanager
def attention_step(batch: object) -> Iterator[None]:
    """Make ``batch`` (the step's ``SlotBatch``) the one this thread's opaque attention calls read."""
    previous = getattr(_STEP, "batch", None)
    _STEP.batch = batch
    try:
        yield
    finally:
        _STEP.batch = previous


def current_attention_batch() -> Any:
    """The ``SlotBatch`` set by :func:`attention_step` on this thread."""
    batch = getattr(_STEP, "batch", None)
    if batch is None:
        raise ContractViolation("a compiled attention ran outside a step: call the model's forward, not its layers.")
    return batch


def compile_available() -> None:
    """Raise :class:`ConfigError` where ``torch.compile`` cannot build CPU kernels here."""
    try:
        with warnings.catch_warnings():
            # Importing inductor runs torch's own deprecated torch.jit code (a DeprecationWarning
            # about torch, not about the caller): import it here, quietly, before torch.compile does.
            warnings.simplefilter("ignore", DeprecationWarning)
            from torch._inductor import compile_fx, cpp_builder  # noqa: F401

        cpp_builder.get_cpp_compiler()
    except ImportError:  # another torch layout: let the first compiled call report what is missing
        return
    except Exception as exc:  # inductor raises plain RuntimeErrors for a missing compiler
        raise ConfigError(
            f"compile=True needs a C++ compiler for inductor's CPU kernels ({exc}); install one "
            "(e.g. g++) or run eagerly with compile=False."
        ) from exc
