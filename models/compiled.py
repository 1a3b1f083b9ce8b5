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
  that calls the projection eagerly — and where every projection of a block would, the whole block
  (attention with its projections, or the MLP) is one such call;
* slot attention, whose runs of slots are Python metadata of the step (``SlotBatch``): traced, every
  new run structure would be a recompilation. It is one opaque op, reading the step's
  ``SlotBatch`` from a thread-local step context (:func:`compiled_step`) set around the compiled
  call.

Each model keeps its own :class:`OpaqueSites`: a call site's id is its index there, given in
layer order, so two models of one architecture trace the same graph with the same guards and share
one compilation (ids from a process-wide counter made every new model a recompilation, and the
ninth hit dynamo's recompile limit). The step context holds the running model's sites and slot
batch; if dynamo ever runs the layers eagerly instead, they read the same context.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractViolation

__all__ = ["OpaqueSites", "compile_available", "compiled_step", "current_attention_batch", "opaque_call"]


class OpaqueSites:
    """One model's opaque call sites: ``add`` returns the id a graph passes to :func:`opaque_call`."""

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[[tuple[Any, ...], list[Tensor]], Tensor], tuple[Any, ...]]] = []

    def add(self, fn: Callable[[tuple[Any, ...], list[Tensor]], Tensor], *objects: Any) -> int:
        """A call site running ``fn(objects, inputs)``; ``fn`` must return a new tensor, never a view
        of an input."""
        self._calls.append((fn, objects))
        return len(self._calls) - 1

    def call(self, call_id: int, inputs: list[Tensor]) -> Tensor:
        fn, objects = self._calls[call_id]
        return fn(objects, inputs)


_STEP = threading.local()  # .sites, .batch: the model and step this thread is running


# Defined with the low-level library API, not ``torch.library.custom_op``: the dispatcher calls the
# kernel directly, without custom_op's Python wrapper layers (a call costs 6.7 µs warm against 10.5).
# It mutates nothing and has no autograd formula: forwards in grad mode run eagerly, outside graphs.
_LIBRARY = torch.library.Library("tokenstate", "DEF")
_LIBRARY.define("opaque_call(Tensor[] inputs, int call_id, int[] tail) -> Tensor")


def _opaque_call(inputs: list[Tensor], call_id: int, tail: list[int]) -> Tensor:
    return _current("sites").call(call_id, inputs)


_LIBRARY.impl("opaque_call", _opaque_call, "CompositeExplicitAutograd")


@torch.library.register_fake("tokenstate::opaque_call", lib=_LIBRARY)
def _opaque_call_shape(inputs: list[Tensor], call_id: int, tail: list[int]) -> Tensor:
    return inputs[0].new_empty(inputs[0].shape[0], *tail)  # [num_tokens, *tail]


def opaque_call(call_id: int, inputs: Sequence[Tensor], tail: Sequence[int]) -> Tensor:
    """``[inputs[0].shape[0], *tail]``: registered call ``call_id`` on ``inputs``, opaque to inductor."""
    return torch.ops.tokenstate.opaque_call(list(inputs), call_id, list(tail))


@contextlib.contextmanager
def compiled_step(sites: OpaqueSites, batch: object) -> Iterator[None]:
    """Make ``sites`` (the running model's) and ``batch`` (the step's ``SlotBatch``) the ones this
    thread's opaque calls and slot attention read."""
    previous = getattr(_STEP, "sites", None), getattr(_STEP, "batch", None)
    _STEP.sites, _STEP.batch = sites, batch
    try:
        yield
    finally:
        _STEP.sites, _STEP.batch = previous


def current_attention_batch() -> Any:
    """The ``SlotBatch`` set by :func:`compiled_step` on this thread."""
    return _current("batch")


def _current(name: str) -> Any:
    value = getattr(_STEP, name, None)
    if value is None:
        raise ContractViolation("a compiled layer ran outside its model's step: call the model's forward, not its layers.")
    return value


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
