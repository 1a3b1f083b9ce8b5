"""Shared launcher plumbing: argument checks, backend choice and the lazy Triton import.

Every public kernel launcher checks dtype, shape, contiguity and device of each argument from
metadata only (never a value read on a device, which would be a host sync) and then picks a
backend: the Triton kernel for CUDA tensors, a twin (numpy or torch) for CPU tensors. Triton is
imported only when a Triton kernel is actually launched, so ``import tokenstate.runtime.kernels``
works on a machine without triton.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Literal, get_args

import torch

from tokenstate.contracts import ConfigError, ContractViolation, get_checks_mode

__all__ = [
    "BACKENDS",
    "Backend",
    "check_index_range",
    "require_tensor",
    "same_device",
    "triton_impl",
    "use_triton",
]

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = get_args(Backend)

_INTERPRET_ENV = "TRITON_INTERPRET"


def _describe(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else f"strides {t.stride()}"
    return f"{t.dtype} {tuple(t.shape)} on {t.device} ({layout})"


def require_tensor(
    fn: str,
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype],
    shape: Sequence[int | None],
    contiguous: bool = True,
) -> torch.Tensor:
    """Check one launcher argument's metadata; ``None`` in ``shape`` accepts any size there."""
    if not isinstance(t, torch.Tensor):
        raise ContractViolation(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    # Messages are only formatted on failure: these checks run on every step.
    if t.dtype not in dtypes:
        raise ContractViolation(
            f"{fn}: {name} must be {' or '.join(str(d) for d in dtypes)}, got {_describe(t)}. "
            f"Convert it with .to({dtypes[0]}) where the buffer is allocated, not per step."
        )
    actual = t.shape
    fits = len(actual) == len(shape)
    if fits:
        for wanted_size, size in zip(shape, actual, strict=True):
            if wanted_size is not None and wanted_size != size:
                fits = False
    if not fits:
        wanted = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ContractViolation(f"{fn}: {name} must have shape {wanted}, got {_describe(t)}.")
    if contiguous and not t.is_contiguous():
        raise ContractViolation(
            f"{fn}: {name} must be contiguous, got {_describe(t)}. Pass a contiguous buffer "
            "(kernels index it by flat offset)."
        )
    return t


def same_device(fn: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    """The one device all ``tensors`` live on; refuses a mix."""
    items = iter(tensors.items())
    first_name, first = next(items)
    device = first.device
    for name, t in items:
        if t.device != device:
            raise ContractViolation(
                f"{fn}: every argument must live on one execution device; {first_name} is on "
                f"{device} but {name} is on {t.device}. Move the per-step inputs to the mirror's "
                "device."
            )
    return device


def check_index_range(fn: str, name: str, t: torch.Tensor, upper: int) -> None:
    """In ``full`` checks mode, refuse CPU index values outside ``[0, upper)`` (no device syncs)."""
    if get_checks_mode() != "full" or t.device.type != "cpu" or t.numel() == 0:
        return
    low, high = int(t.min()), int(t.max())
    if low < 0 or high >= upper:
        raise ContractViolation(
            f"{fn}: {name} values must lie in [0, {upper}), got min {low} and max {high}."
        )


def use_triton(fn: str, backend: str, device: torch.device) -> bool:
    """Whether to launch the Triton kernel: CUDA → Triton, CPU → a twin, unless forced."""
    if backend not in BACKENDS:
        raise ConfigError(f"{fn}: backend={backend!r} is not one of {', '.join(BACKENDS)}.")
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda"
    if device.type != "cuda" and os.environ.get(_INTERPRET_ENV) != "1":
        raise ConfigError(
            f"{fn}: backend='triton' on {device} needs the Triton interpreter: set "
            f"{_INTERPRET_ENV}=1 before triton is first imported, or use backend='auto'/'torch'."
        )
    return True


def triton_impl(module: str) -> ModuleType:
    """Import a private Triton kernel module (``tokenstate.runtime.kernels.<module>``) on demand."""
    try:
        return importlib.import_module(f"tokenstate.runtime.kernels.{module}")
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] != "triton":
            raise
        raise ConfigError(
            f"the Triton kernel in {module} needs triton, which is not importable ({exc}). Install "
            "triton (it ships with CUDA builds of torch) or pass backend='torch' to run the twin."
        ) from exc
