"""Which CPU GEMM a projection runs: oneDNN's pre-packed inner product or ``torch.mm`` on a transposed
copy, chosen by measuring both on this machine (``TOKENSTATE_CPU_GEMM=auto``, the default).

Both paths are exact float32 GEMMs that differ only in summation order (results move in the last
bits). Which one is faster depends on the CPU and on where the weight comes from, not on the code: on
one shared 2-core VM the answer for a hidden-256 model's weights flipped between sessions (oneDNN
1.1-1.7x faster at 16 rows on one day, ``torch.mm`` 1.2-1.7x faster on a later day with another host
CPU under the VM), and a fixed size threshold tuned on one day cost 10 % of the tiny model's
throughput on the next. So each weight shape is measured once per process, the way an autotuner picks
a kernel, and the faster path is kept:

* at :data:`CALIBRATION_ROWS` rows (a decode batch), the median of :data:`CALIBRATION_REPS`
  interleaved calls decides packed or transposed. Between timed calls the model's own weights are
  read once (:func:`calibrating`, used by :func:`~tokenstate.models.fused_linear.prepack`), as in a
  step, where every other weight passes through the caches in between: a small model's weights then
  come from L3, a big one's from DRAM, and the two paths rank differently in the two cases (on this
  machine ``torch.mm`` won from L3 and oneDNN from DRAM for the same 1024 x 2048 weight);
* a packed group small enough to keep a second copy (``one_row_eligible``) is also timed at one
  row, where oneDNN's fixed call cost can exceed the GEMM; the transposed copy is kept for one-row
  inputs only where ``torch.mm`` measured faster there.

The choice is cached per shape and intra-op thread count for the process (:func:`gemm_choices`
lists it), so every model of one shape in a process — the async and the sync engine the token gate
compares, say — runs the same kernels and gets the same bits. ``TOKENSTATE_CPU_GEMM=onednn`` or
``mm`` pins the path instead (for reproducing a run bit for bit on other machines, or for A/B
measurements); :func:`set_cpu_gemm_mode` and :func:`cpu_gemm_mode` do so in-process.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from tokenstate.contracts import validated_setting

__all__ = [
    "CALIBRATION_REPS",
    "CALIBRATION_ROWS",
    "CPU_GEMM_ENV",
    "CPU_GEMM_MODES",
    "CpuGemmMode",
    "GemmChoice",
    "calibrating",
    "choose_gemm",
    "cpu_gemm_mode",
    "gemm_choices",
    "get_cpu_gemm_mode",
    "set_cpu_gemm_mode",
]

CpuGemmMode = Literal["auto", "onednn", "mm"]
CPU_GEMM_MODES: tuple[str, ...] = get_args(CpuGemmMode)
CPU_GEMM_ENV = "TOKENSTATE_CPU_GEMM"
CALIBRATION_ROWS = 16
"""Rows of the decode batch both paths are timed at (also oneDNN's packing hint)."""
CALIBRATION_REPS = 5
"""Timed calls per path and row count; the median decides (interleaved, so drift hits both)."""
_EVICT_BYTES = 8 * 2**20
"""Written between timed calls outside :func:`calibrating`: more than a core's L2, so the weight
comes from L3 at least."""
_MAX_SWEEP_BYTES = 2**28
"""At most this much of a model's weights is read between two timed calls (bounds the calibration
time of a big model; it exceeds any L3)."""


@dataclass(frozen=True, slots=True)
class GemmChoice:
    """How one weight shape runs on the CPU, and the measurements behind it (µs; ``None``: pinned)."""

    packed: bool  # oneDNN's pre-packed inner product (else torch.mm on the transposed copy)
    one_row_mm: bool  # a packed group also keeps the transposed copy for one-row inputs
    onednn_us: float | None = None  # median at CALIBRATION_ROWS rows
    mm_us: float | None = None
    onednn_one_row_us: float | None = None  # median at one row (packed, eligible groups only)
    mm_one_row_us: float | None = None


class _State:
    """The process's mode and calibration state (one instance; attributes, so no ``global`` rebinding)."""

    def __init__(self) -> None:
        self.mode: str | None = None  # None: read TOKENSTATE_CPU_GEMM on next use
        self.sweep: tuple[Tensor, ...] = ()  # the weights read between timed calls (see calibrating)
        self.evict_buffer: Tensor | None = None


_state = _State()
_choices: dict[tuple[int, int, int, bool], GemmChoice] = {}


def _validated(value: str, source: str) -> str:
    default = "auto, which measures both paths once per weight shape"
    return validated_setting(value, source, CPU_GEMM_MODES, what="CPU GEMM mode", default=default)


def get_cpu_gemm_mode() -> str:
    """The active mode (reads ``TOKENSTATE_CPU_GEMM`` on first use; default ``auto``)."""
    if _state.mode is None:
        _state.mode = _validated(os.environ.get(CPU_GEMM_ENV, "auto"), CPU_GEMM_ENV)
    return _state.mode


def set_cpu_gemm_mode(mode: str | None) -> None:
    """Pin the mode for this process (``None``: re-read ``TOKENSTATE_CPU_GEMM`` on next use).

    Takes effect for projections (re)built afterwards: call :func:`~tokenstate.models.fused_linear.prepack`
    on a model built before.
    """
    _state.mode = None if mode is None else _validated(mode, "CPU GEMM mode")


@contextlib.contextmanager
def calibrating(weights: Iterable[Tensor]) -> Iterator[None]:
    """Measure the shapes first seen in this block with ``weights`` (a model's) read between timed calls."""
    previous, total, chosen = _state.sweep, 0, []
    for w in weights:
        if w.device.type == "cpu" and total < _MAX_SWEEP_BYTES:
            chosen.append(w.detach())
            total += w.numel() * w.element_size()
    _state.sweep = tuple(chosen)
    try:
        yield
    finally:
        _state.sweep = previous


@contextlib.contextmanager
def cpu_gemm_mode(mode: str) -> Iterator[None]:
    """Build projections under another mode in a block, restoring the previous one afterwards."""
    previous = _state.mode
    set_cpu_gemm_mode(mode)
    try:
        yield
    finally:
        _state.mode = previous


def gemm_choices() -> dict[tuple[int, int, int, bool], GemmChoice]:
    """The measured choices of this process, by ``(in_features, out_features, threads,
    one_row_eligible)``."""
    return dict(_choices)


def choose_gemm(weight: Tensor, *, one_row_eligible: bool) -> GemmChoice:
    """How the fused ``weight`` (``[out, in]`` float32, CPU) runs: pinned by the mode, else measured
    once per shape and thread count in this process."""
    mode = get_cpu_gemm_mode()
    if mode != "auto":
        packed = mode == "onednn"
        return GemmChoice(packed=packed, one_row_mm=packed and one_row_eligible)
    out_features, in_features = weight.shape
    key = (in_features, out_features, torch.get_num_threads(), one_row_eligible)
    choice = _choices.get(key)
    if choice is None:
        choice = _choices[key] = _measure(weight, one_row_eligible=one_row_eligible)
    return choice


def _evict() -> None:
    """Push the timed weight out of the caches, as the rest of a step would."""
    if _state.sweep:
        for w in _state.sweep:
            w.sum()
        return
    if _state.evict_buffer is None:
        # A normal tensor even when the first measurement runs under inference mode (a lazy
        # re-pack inside an engine's step): an inference tensor refuses the in-place write below
        # in every later measurement outside it.
        with torch.inference_mode(False):
            _state.evict_buffer = torch.zeros(_EVICT_BYTES // 4)
    _state.evict_buffer.add_(1.0)


def _median_us(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median µs per call of each function, timed interleaved (order swapped every round)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for name in names:
        calls[name]()  # first call: oneDNN creates its primitive, MKL its buffers
    for rep in range(CALIBRATION_REPS):
        for name in names if rep % 2 else names[::-1]:
            _evict()
            start = time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def _measure(weight: Tensor, *, one_row_eligible: bool) -> GemmChoice:
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, CALIBRATION_ROWS)
        weight_t = weight.t().contiguous()  # [in, out]
        in_features = weight.shape[1]

        def both(x: Tensor) -> dict[str, float]:
            return _median_us({
                "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                "mm": lambda: torch.mm(x, weight_t),
            })  # fmt: skip

        rows = both(torch.randn(CALIBRATION_ROWS, in_features))
        choice = GemmChoice(
            packed=rows["onednn"] < rows["mm"], one_row_mm=False, onednn_us=rows["onednn"], mm_us=rows["mm"]
        )
        if not (choice.packed and one_row_eligible):
            return choice
        one = both(torch.randn(1, in_features))
        return GemmChoice(
            packed=True, one_row_mm=one["mm"] < one["onednn"], onednn_us=rows["onednn"], mm_us=rows["mm"],
            onednn_one_row_us=one["onednn"], mm_one_row_us=one["mm"],
        )  # fmt: skip
