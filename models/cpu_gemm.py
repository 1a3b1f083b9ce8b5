"""Which CPU GEMM a projection runs: oneDNN's pre-packed inner product or ``torch.mm`` on a transposed
copy, chosen by measuring both on this machine (``TOKENSTATE_CPU_GEMM=auto``, the default).

Both paths are exact float32 GEMMs that differ only in summation order (results move in the last
bits). Which one is faster depends on the CPU and on where the weight comes from, not on the code: on
one shared 2-core VM the answer for a hidden-256 model's weights flipped between sessions (oneDNN
1.1-1.7x faster at 16 rows on one day, ``torch.mm`` 1.2-1.7x faster on a later day with another host
CPU under the VM), and a fixed size threshold tuned on one day cost 10 % of the tiny model's
throughput on the next. So the paths are measured once per process, the way an autotuner picks a
kernel, and the faster one is kept:

* **a model pass** (:func:`calibrate_model`, run by :func:`~tokenstate.models.fused_linear.prepack`):
  every projection GEMM of the model at :data:`CALIBRATION_ROWS` rows (a decode batch), one after
  another in step order, as a step runs them — each weight then comes back from wherever the
  others pushed it, L3 or DRAM (at least :data:`PASS_BYTES` of weights are read per pass). The
  passes with all new shapes packed and all on ``torch.mm`` are timed interleaved, then each shape
  is flipped in turn and kept where the pass got faster. Timing one shape alone, with the model's
  weights read in between, ranked three of a tiny model's four shapes the other way round from
  these passes on one machine (passes: every shape packed 1.56x faster than none, the engine 1.03x);
* **one shape alone** (:func:`choose_gemm` for a shape no pass decided, e.g. a lone
  ``FusedProjection``): the median of :data:`CALIBRATION_REPS` interleaved calls at
  :data:`CALIBRATION_ROWS` rows, with the weights given to :func:`calibrating` read between two
  timed calls;
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
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    "PASS_BYTES",
    "CpuGemmMode",
    "GemmChoice",
    "calibrate_model",
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
PASS_BYTES = 2**26
"""A model pass reads at least this much weight (where the model has it): twice this machine's L3,
so a weight comes back from DRAM when a step's would; a bigger model's pass stops there (plus one
group of each shape not yet included), bounding the calibration's time and its transient copies."""
_MAX_SWEEP_BYTES = 2**28
"""At most this much of a model's weights is read between two timed calls (bounds the calibration
time of a big model; it exceeds any L3)."""


@dataclass(frozen=True, slots=True)
class GemmChoice:
    """How one weight shape runs on the CPU, and the measurements behind it (µs; ``None``: pinned)."""

    packed: bool  # oneDNN's pre-packed inner product (else torch.mm on the transposed copy)
    one_row_mm: bool  # a packed group also keeps the transposed copy for one-row inputs
    # Median at CALIBRATION_ROWS rows: of one call (timed alone), or of a whole model pass with this
    # shape packed / on torch.mm and every other shape as then chosen (model_pass).
    onednn_us: float | None = None
    mm_us: float | None = None
    onednn_one_row_us: float | None = None  # median of one call at one row (packed, eligible groups only)
    mm_one_row_us: float | None = None
    model_pass: bool = False  # decided by calibrate_model's passes (else timed alone)


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
    key = _key_of((weight,), one_row_eligible)
    choice = _choices.get(key)
    if choice is None:
        choice = _choices[key] = _measure(weight, one_row_eligible=one_row_eligible)
    return choice


def calibrate_model(groups: Sequence[tuple[Sequence[Tensor], bool]]) -> None:
    """Decide every shape of ``groups`` this process has not decided yet, by timing model passes.

    ``groups`` are a model's packable projection groups in step order: the ``[out_i, in]`` float32
    CPU weights fused into one GEMM, and whether the group is ``one_row_eligible``. Nothing happens
    under a pinned mode or when every shape is decided. See the module docstring for the passes.
    """
    if get_cpu_gemm_mode() != "auto":
        return
    keyed = [(_key_of(weights, eligible), weights) for weights, eligible in groups]
    new = list(dict.fromkeys(k for k, _ in keyed if k not in _choices))
    if not new:
        return
    with torch.no_grad():
        timed = _pass_groups(keyed, set(new))

        def passes_us(configs: dict[str, frozenset]) -> dict[str, float]:
            """Median µs of a pass per configuration (the new shapes it packs; decided ones as decided)."""
            layouts = {
                name: [k in packs if k in new else _choices[k].packed for k, _, _ in timed]
                for name, packs in configs.items()
            }  # fmt: skip
            return _pass_us(timed, layouts)

        none, every = frozenset(), frozenset(new)
        start = passes_us({"mm": none, "onednn": every})
        chosen = every if start["onednn"] < start["mm"] else none
        for k in new:  # flip each shape in turn, keep the flip where the pass got faster
            with_k, without_k = chosen | {k}, chosen - {k}
            us = passes_us({"onednn": with_k, "mm": without_k})
            chosen = with_k if us["onednn"] < us["mm"] else without_k
            _choices[k] = GemmChoice(
                packed=k in chosen, one_row_mm=False, onednn_us=us["onednn"], mm_us=us["mm"], model_pass=True
            )  # fmt: skip
        copies = {k: (packed, weight_t) for k, packed, weight_t in timed}  # every new shape has a group there
        for k in new:  # the one-row copy: timed alone, once per packed eligible shape
            if _choices[k].packed and k[3]:
                _choices[k] = _with_one_row(_choices[k], *copies[k])


def _key_of(weights: Sequence[Tensor], one_row_eligible: bool) -> tuple[int, int, int, bool]:
    """The cache key of a group's fused ``[sum(out_i), in]`` weight: ``(in, out, threads, eligible)``."""
    in_features = weights[0].shape[1]
    return (in_features, sum(w.shape[0] for w in weights), torch.get_num_threads(), one_row_eligible)


def _fused(weights: Sequence[Tensor]) -> Tensor:
    """``[sum(out_i), in]``: the group's weights as one (the weight itself for a group of one)."""
    return weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])


def _pass_us(timed: list[tuple[tuple[int, int, int, bool], Tensor, Tensor]], layouts: dict[str, list[bool]]) -> dict[str, float]:
    """Median µs of a pass per layout: every group of ``timed`` in order, packed where the layout says."""
    inputs = {k[0]: torch.randn(CALIBRATION_ROWS, k[0]) for k, _, _ in timed}  # per in_features: [rows, in]

    def model_pass(layout: list[bool]) -> Callable[[], None]:
        calls = [
            functools.partial(torch.ops.mkldnn._linear_pointwise, inputs[k[0]], packed, None, "none", [], "")
            if packs else functools.partial(torch.mm, inputs[k[0]], weight_t)
            for (k, packed, weight_t), packs in zip(timed, layout, strict=True)
        ]  # fmt: skip

        def run() -> None:
            for call in calls:
                call()

        return run

    return _median_us({name: model_pass(layout) for name, layout in layouts.items()}, evict=False)


def _pass_groups(
    keyed: list[tuple[tuple[int, int, int, bool], Sequence[Tensor]]], new: set
) -> list[tuple[tuple[int, int, int, bool], Tensor, Tensor]]:
    """``(key, packed copy, transposed copy)`` of the groups a pass runs, in step order: the first
    :data:`PASS_BYTES` of weights, and the first group of each new shape beyond them."""
    timed, total, seen = [], 0, set()
    for k, weights in keyed:
        if total >= PASS_BYTES and (k not in new or k in seen):
            continue
        weight = _fused(weights)  # [out, in]
        timed.append((k, *_copies(weight)))
        total += weight.numel() * weight.element_size()
        seen.add(k)
    return timed


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


def _median_us(calls: dict[str, Callable[[], object]], *, evict: bool = True) -> dict[str, float]:
    """Median µs per call of each function, timed interleaved (order swapped every round); with
    ``evict``, the weights are pushed out of the caches before each timed call."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for name in names:
        calls[name]()  # first call: oneDNN creates its primitive, MKL its buffers
    for rep in range(CALIBRATION_REPS):
        for name in names if rep % 2 else names[::-1]:
            if evict:
                _evict()
            start = time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def _measure(weight: Tensor, *, one_row_eligible: bool) -> GemmChoice:
    """Time ``weight`` (``[out, in]``) alone on both paths (see the module docstring)."""
    with torch.no_grad():
        packed, weight_t = _copies(weight)
        rows = _paths_us(torch.randn(CALIBRATION_ROWS, weight.shape[1]), packed, weight_t)
        choice = GemmChoice(
            packed=rows["onednn"] < rows["mm"], one_row_mm=False, onednn_us=rows["onednn"], mm_us=rows["mm"]
        )
        return _with_one_row(choice, packed, weight_t) if choice.packed and one_row_eligible else choice


def _copies(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``weight`` (``[out, in]``) packed for oneDNN, and transposed (``[in, out]``) for ``torch.mm``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, CALIBRATION_ROWS), weight.t().contiguous()


def _paths_us(x: Tensor, packed: Tensor, weight_t: Tensor) -> dict[str, float]:
    return _median_us({
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "mm": lambda: torch.mm(x, weight_t),
    })  # fmt: skip


def _with_one_row(choice: GemmChoice, packed: Tensor, weight_t: Tensor) -> GemmChoice:
    """``choice`` (packed) with the one-row decision: keep the transposed copy where ``torch.mm`` won."""
    one = _paths_us(torch.randn(1, weight_t.shape[0]), packed, weight_t)  # [1, in] input
    return GemmChoice(
        packed=choice.packed, one_row_mm=one["mm"] < one["onednn"], onednn_us=choice.onednn_us,
        mm_us=choice.mm_us, onednn_one_row_us=one["onednn"], mm_one_row_us=one["mm"], model_pass=choice.model_pass,
    )  # fmt: skip
