"""One matmul for several projections of the same input (q/k/v, gate/up), HF names kept.

The separate ``nn.Linear`` modules stay the parameters (so checkpoints load and save by HF name and
the state dict round-trips unchanged); :class:`FusedProjection` keeps a concatenated copy of their
weights for inference and rebuilds it whenever a source parameter was replaced, re-pointed or
written in place (its identity, storage or version counter moved). On a tiny model a step is bound
by the op count, so one ``[n, sum(out)]`` matmul instead of two or three saves a launch per
projection per layer.

While autograd records (grad mode on and a weight requires grad), a weight is an inference tensor
(no version counter to watch) or the weights exceed :data:`MAX_FUSED_BYTES` (the copy would cost
real memory), the projections run one by one, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MAX_FUSED_BYTES", "FusedProjection"]

MAX_FUSED_BYTES = 16 * 2**20
"""Largest fused copy kept (bytes per group). The copy duplicates its weights, which only pays
where a step is bound by op count (small models); bigger projections run one by one, as before."""

# Per source tensor: the tensor itself (held, so its memory is never reused under a cached
# address), its data pointer and its version counter.
_Watch = tuple[Tensor, int, int]


def _watch(t: Tensor) -> _Watch:
    return (t, t.data_ptr(), t._version)


def _unchanged(t: Tensor | None, seen: _Watch | None) -> bool:
    if t is None or seen is None:
        return t is None and seen is None
    return t is seen[0] and t.data_ptr() == seen[1] and t._version == seen[2]


class FusedProjection:
    """Applies several ``nn.Linear`` of one input as one matmul; a plain helper, not a module.

    It is deliberately not an ``nn.Module``: the cached fused weight must never appear in the
    state dict, in ``parameters()`` or in ``.to()`` (a moved model simply rebuilds the cache).
    """

    __slots__ = ("_bias", "_seen", "_weight")

    def __init__(self) -> None:
        self._seen: list[tuple[_Watch, _Watch | None]] = []  # per linear: weight, bias
        self._weight: Tensor | None = None  # [sum(out_features), in_features]
        self._bias: Tensor | None = None  # [sum(out_features)] or None

    def __call__(self, x: Tensor, linears: Sequence[nn.Linear]) -> Tensor:
        """``x`` ``[..., in]`` through every linear: ``[..., sum(out_i)]``, outputs side by side."""
        if torch.is_grad_enabled() and any(lin.weight.requires_grad for lin in linears):
            return torch.cat([lin(x) for lin in linears], dim=-1)
        if not self._is_current(linears) and not self._rebuild(linears):
            return torch.cat([lin(x) for lin in linears], dim=-1)
        return F.linear(x, self._weight, self._bias)

    def _is_current(self, linears: Sequence[nn.Linear]) -> bool:
        if self._weight is None or len(self._seen) != len(linears):
            return False
        for lin, (w, b) in zip(linears, self._seen, strict=True):
            params = lin._parameters  # the module's own dict: skips nn.Module.__getattr__ per read
            if not (_unchanged(params["weight"], w) and _unchanged(params.get("bias"), b)):
                return False
        return True

    def _rebuild(self, linears: Sequence[nn.Linear]) -> bool:
        """Cache the fused weight; False (nothing cached) where it could not be watched."""
        self._weight, self._bias, self._seen = None, None, []
        weights = [lin.weight for lin in linears]
        biases = [lin.bias for lin in linears]
        present = [b for b in biases if b is not None]
        if present and len(present) != len(biases):
            return False  # some with bias, some without: no single fused bias
        if any(t.is_inference() for t in weights + present):
            return False
        if sum(t.numel() * t.element_size() for t in weights + present) > MAX_FUSED_BYTES:
            return False
        with torch.no_grad():
            self._weight = torch.cat(weights, dim=0).detach()  # [sum(out), in]
            self._bias = torch.cat(present, dim=0).detach() if present else None  # [sum(out)]
        self._seen = [
            (_watch(w), None if b is None else _watch(b)) for w, b in zip(weights, biases, strict=True)
        ]
        return True
