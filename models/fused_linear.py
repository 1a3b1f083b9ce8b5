"""One matmul for several projections of the same input (q/k/v, gate/up), HF names kept; on the CPU,
through oneDNN with the weight pre-packed once or ``torch.mm`` on a transposed copy, whichever
measured faster.

The separate ``nn.Linear`` modules stay the parameters (so checkpoints load and save by HF name and
the state dict round-trips unchanged); :class:`FusedProjection` keeps a concatenated copy of their
weights for inference and rebuilds it whenever a source parameter was replaced, re-pointed or
written in place (its identity, storage or version counter moved). On a tiny model a step is bound
by the op count, so one ``[n, sum(out)]`` matmul instead of two or three saves a launch per
projection per layer.

**Pre-packing (CPU, float32).** ``F.linear`` on the CPU is MKL ``sgemm`` with a transposed
``[out, in]`` weight. oneDNN's inner product with the weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, then ``torch.ops.mkldnn._linear_pointwise`` — the
ops torch's own CPU freezing pass uses) works for any row count (the reorder's batch size is only a
hint) and measured 1.2-1.6x faster than ``torch.mm`` at decode batch sizes for a hidden-1024 model's
weights streaming from DRAM — but slower for a hidden-256 model's, on one machine and not on another.
So for a group of at least :data:`MIN_PACKED_ELEMENTS` the path is measured once per shape
(:mod:`tokenstate.models.cpu_gemm`, ``TOKENSTATE_CPU_GEMM=auto|onednn|mm``): packed, or the
transposed copy described next. oneDNN costs a fixed ~10 µs a call, so smaller weights never try it,
and a packed group below :data:`MIN_ONE_ROW_PACKED_ELEMENTS` also keeps the transposed copy for
one-row inputs where that measured faster. Results differ from ``F.linear`` in the last bits (a
different summation order), as ``F.linear`` itself does between batch sizes. Packing happens when a
model is built or loaded (:func:`prepack`), and again lazily after any weight change (e.g.
``model.to(device)``).

**Transposed layout (CPU, unpacked weights).** The weights that stay off oneDNN are kept as one
contiguous ``[in, sum(out)]`` copy and applied with ``torch.mm`` / ``torch.addmm``: MKL's GEMM with
the weight already transposed measured 1.3–1.7x faster than ``F.linear``'s transposed ``[out, in]``
read at 1–16 rows and 1.2–1.4x at 64 (hidden 256..768 weights; equal from ~256 rows on). The copy
is the weight's size again, so it is kept only up to :data:`MAX_FUSED_BYTES` — or up to
:data:`MAX_PACKED_BYTES` where it measured faster than the packed copy it then replaces; on CUDA the
weight is used as it is.

While autograd records (grad mode on and a weight requires grad), a weight is an inference tensor
(no version counter to watch) or the weights exceed the copy limit (:data:`MAX_FUSED_BYTES` for a
plain copy, :data:`MAX_PACKED_BYTES` for a packed one), the projections run one by one, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.models.compiled import OpaqueSites, opaque_call
from tokenstate.models.cpu_gemm import CALIBRATION_ROWS, calibrate_model, calibrating, choose_gemm

__all__ = [
    "MAX_FUSED_BYTES",
    "MAX_PACKED_BYTES",
    "MIN_ONE_ROW_PACKED_ELEMENTS",
    "MIN_PACKED_ELEMENTS",
    "FusedProjection",
    "onednn_packing_available",
    "prepack",
]

MAX_FUSED_BYTES = 16 * 2**20
"""Largest plain fused copy kept (bytes per group). The copy duplicates its weights, which only pays
where a step is bound by op count (small models); bigger projections run one by one, as before."""
MAX_PACKED_BYTES = 2**30
"""Largest oneDNN-packed copy kept (bytes per group): the packed copy doubles the group's weight
memory, which the faster GEMM pays for at every size up to an LM head of a 32k vocabulary."""
MIN_PACKED_ELEMENTS = 2**17
"""Weights with fewer elements stay on ``torch.mm`` without measuring: there oneDNN's ~10 µs per call
costs more than its GEMM can save (16 rows, 256x256: 0.8x the speed of ``torch.mm`` on the machine
where oneDNN won at every bigger size). From this size on the path is measured (``cpu_gemm``)."""
MIN_ONE_ROW_PACKED_ELEMENTS = 2**20
"""Packed groups with fewer elements may also keep the transposed ``torch.mm`` copy (a third copy of
small weights), read by one-row inputs where it measured faster: at one row oneDNN ran at 0.3–0.7x
``torch.mm`` below 2^19 elements, about even up to 2^20 and 1.1x above."""

# Per source tensor: the tensor itself (held, so its memory is never reused under a cached
# address), its data pointer and its version counter.
_Watch = tuple[Tensor, int, int]


def _watch(t: Tensor) -> _Watch:
    return (t, t.data_ptr(), t._version)


def _unchanged(t: Tensor | None, seen: _Watch | None) -> bool:
    if t is None or seen is None:
        return t is None and seen is None
    return t is seen[0] and t.data_ptr() == seen[1] and t._version == seen[2]


def onednn_packing_available() -> bool:
    """Whether this torch build exposes the oneDNN pre-packed linear ops (CPU builds with mkldnn)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._reorder_linear_weight) and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


_PACKING = onednn_packing_available()


def _packs(weights: Sequence[Tensor]) -> bool:
    """Whether these ``[out_i, in]`` weights, fused, may go through oneDNN's packed inner product
    (then :func:`~tokenstate.models.cpu_gemm.choose_gemm` decides whether they do)."""
    numel = sum(w.numel() for w in weights)
    first = weights[0]
    return (
        _PACKING
        and all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights)
        and numel >= MIN_PACKED_ELEMENTS
        and numel * first.element_size() <= MAX_PACKED_BYTES
    )


class FusedProjection:
    """Applies several ``nn.Linear`` of one input as one matmul; a plain helper, not a module.

    It is deliberately not an ``nn.Module``: the cached fused weight must never appear in the
    state dict, in ``parameters()`` or in ``.to()`` (a moved model simply rebuilds the cache). A
    copy (``copy.deepcopy``, pickling) starts with an empty cache: a packed oneDNN tensor has no
    storage to copy, and the copy's weights are new tensors anyway.
    """

    __slots__ = ("_bias", "_op", "_packed", "_seen", "_weight", "_weight_t")

    def __init__(self) -> None:
        self._seen: list[tuple[_Watch, _Watch | None]] = []  # per linear: weight, bias
        self._weight: Tensor | None = None  # [sum(out_features), in_features]
        # On the CPU: the fused weight transposed, contiguous (then _weight is None); unpacked
        # groups read it always, packed ones below MIN_ONE_ROW_PACKED_ELEMENTS for one-row inputs.
        self._weight_t: Tensor | None = None  # [in_features, sum(out_features)]
        self._bias: Tensor | None = None  # [sum(out_features)] or None
        # oneDNN blocked copy of the fused weight (opaque layout), or None; when set, _weight is
        # None for a fused group (the packed copy, and maybe the transposed one, are the duplicates).
        self._packed: Tensor | None = None
        # Inside a compiled graph: (call id, output features) of the opaque op that calls this
        # projection (see make_opaque); None runs it in place even there.
        self._op: tuple[int, int] | None = None

    def __deepcopy__(self, memo: dict) -> FusedProjection:
        return FusedProjection()

    def __reduce__(self) -> tuple[type, tuple]:
        return (FusedProjection, ())

    @property
    def packed(self) -> bool:
        """Whether the current cache runs oneDNN's pre-packed inner product."""
        return self._packed is not None

    def opaque_in_graph(self) -> bool:
        """Whether a compiled graph runs this projection (of a ``[tokens, in]`` input) as an opaque
        call: packed, or unwatched (no transposed copy for the graph to read)."""
        return self._packed is not None or self._weight_t is None

    def __call__(self, x: Tensor, linears: Sequence[nn.Linear]) -> Tensor:
        """``x`` ``[..., in]`` through every linear: ``[..., sum(out_i)]``, outputs side by side."""
        if self._op is not None and torch.compiler.is_compiling():
            if self.opaque_in_graph() or x.dim() != 2:
                return opaque_call(self._op[0], (x,), (self._op[1],))  # packed or unwatched: run as ours
            # Traced into the graph below, reading the current transposed copy: the owner re-checks
            # every weight before each compiled call (make_opaque), so no copy is stale.
        elif torch.is_grad_enabled() and any(lin.weight.requires_grad for lin in linears):
            return _separate(x, linears)
        elif not self._is_current(linears) and not self._rebuild(linears):
            return _separate(x, linears)
        weight_t = self._weight_t
        if self._packed is not None and (weight_t is None or x.numel() != x.shape[-1]):
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias, "none", [], "")
        if weight_t is not None:  # unpacked, or packed and one row
            if x.dim() == 2:  # [n, in] @ [in, out]: MKL reads the weight row-major
                return torch.mm(x, weight_t) if self._bias is None else torch.addmm(self._bias, x, weight_t)
            out = torch.matmul(x, weight_t)  # [..., sum(out)]
            return out if self._bias is None else out + self._bias
        return F.linear(x, self._weight, self._bias)

    def make_opaque(self, linears: Sequence[nn.Linear], sites: OpaqueSites) -> None:
        """Make this projection compile: inside a ``torch.compile`` graph, ``x`` ``[tokens, in]``
        runs ``torch.mm`` on the transposed copy (traced, so inductor fuses around it) or, for a
        packed or unwatched group, one opaque op that calls :meth:`__call__` eagerly.

        The caller must call :meth:`prepare` before every compiled call, so a weight written after
        compilation is picked up: the graph reads the copy the check just made current
        (:meth:`tokenstate.models.dense.DenseModel.compile_layers` does).
        """
        out_features = sum(lin.out_features for lin in linears)
        self._op = (sites.add(_call_projection, self, *linears), out_features)

    def prepare(self, linears: Sequence[nn.Linear]) -> None:
        """Build (and pack) the cache now, e.g. at load time, instead of on the first call."""
        if not self._is_current(linears):
            self._rebuild(linears)

    def _is_current(self, linears: Sequence[nn.Linear]) -> bool:
        if (self._weight is None and self._packed is None and self._weight_t is None) or len(
            self._seen
        ) != len(linears):
            return False
        for lin, (w, b) in zip(linears, self._seen, strict=True):
            params = lin._parameters  # the module's own dict: skips nn.Module.__getattr__ per read
            if not (_unchanged(params["weight"], w) and _unchanged(params.get("bias"), b)):
                return False
        return True

    def _rebuild(self, linears: Sequence[nn.Linear]) -> bool:
        """Cache the fused (and maybe packed) weight; False (nothing cached) where it could not be watched."""
        self._weight, self._weight_t, self._bias, self._packed, self._seen = None, None, None, None, []
        weights = [lin.weight for lin in linears]
        biases = [lin.bias for lin in linears]
        present = [b for b in biases if b is not None]
        if present and len(present) != len(biases):
            return False  # some with bias, some without: no single fused bias
        if any(t.is_inference() for t in weights + present):
            return False
        candidate = _packs(weights)  # big enough for oneDNN to be worth measuring
        nbytes = sum(t.numel() * t.element_size() for t in weights + present)
        if len(linears) > 1 and not candidate and nbytes > MAX_FUSED_BYTES:
            return False
        with torch.no_grad():
            # One linear unpacked: use its own weight, no copy at all.
            self._weight = (torch.cat(weights, dim=0) if len(weights) > 1 else weights[0]).detach()  # [sum(out), in]
            self._bias = (torch.cat(present, dim=0) if len(present) > 1 else present[0]).detach() if present else None
            choice = choose_gemm(self._weight, one_row_eligible=_one_row_eligible(weights)) if candidate else None
            if choice is not None and choice.packed:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self._weight, CALIBRATION_ROWS)
                if choice.one_row_mm:
                    self._weight_t = self._weight.t().contiguous()  # [in, sum(out)]: one-row inputs
                if len(weights) > 1 or self._weight_t is not None:
                    self._weight = None  # only the copies are read
            elif self._weight.device.type == "cpu" and (choice is not None or nbytes <= MAX_FUSED_BYTES):
                # The faster CPU layout where it measured faster than oneDNN (then it replaces the
                # packed copy, so it may be as big), else for small weights.
                self._weight_t = self._weight.t().contiguous()  # [in, sum(out)]
                self._weight = None  # only the transposed copy is read
        self._seen = [
            (_watch(w), None if b is None else _watch(b)) for w, b in zip(weights, biases, strict=True)
        ]
        return True


def _separate(x: Tensor, linears: Sequence[nn.Linear]) -> Tensor:
    return linears[0](x) if len(linears) == 1 else torch.cat([lin(x) for lin in linears], dim=-1)


def prepack(model: nn.Module) -> nn.Module:
    """Build every fused/packed projection cache of ``model`` now (returns ``model``).

    Calls ``prepack_linears()`` on each submodule that has one (the layers that own a
    :class:`FusedProjection`). Run it once the weights are final — after building or loading —
    so the first step does not pay for packing; a later weight change is picked up lazily.
    """
    with torch.no_grad():
        # Every packable shape first seen here is decided by passes over the model's GEMMs in step
        # order; one no pass could see (none, normally) is timed alone, the model's weights between.
        calibrate_model([(w, _one_row_eligible(w)) for w in _projection_weights(model) if _packs(w)])
        with calibrating(model.parameters()):
            for module in model.modules():
                hook = getattr(module, "prepack_linears", None)
                if callable(hook):
                    hook()
    return model


def _projection_weights(model: nn.Module) -> list[list[Tensor]]:
    """The weights of each :class:`FusedProjection` of ``model``, in the order a step runs them.

    Modules list their projections with ``projections()`` (pairs of a projection and its linears); a
    post-order walk puts a layer's projections before the next layer's and the LM head's last, and a
    projection listed twice (by a layer and by its attention block) counts once.
    """
    seen: set[int] = set()
    groups = []
    for module in _post_order(model):
        listed = getattr(module, "projections", None)
        for projection, linears in listed() if callable(listed) else ():
            if id(projection) not in seen:
                seen.add(id(projection))
                groups.append([lin.weight for lin in linears])
    return groups


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _one_row_eligible(weights: Sequence[Tensor]) -> bool:
    return sum(w.numel() for w in weights) < MIN_ONE_ROW_PACKED_ELEMENTS


def _call_projection(objects: tuple, inputs: list[Tensor]) -> Tensor:
    projection, *linears = objects
    return projection(inputs[0], linears)
