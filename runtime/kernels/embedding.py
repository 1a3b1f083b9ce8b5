"""Guarded embedding gather: ids outside ``[0, vocab)`` are refused, never clamped.

A ``PLACEHOLDER`` (-1) reaching an embedding is the stale-host-ids bug; a plain gather would read
another token's row (or memory before the table) and the model would produce fluent wrong text. The
guarded gather writes a zero row for every id outside ``[0, vocab)`` (the Triton kernel never forms
its address; the twin looks up row 0 in its place and zeroes the result), sets a per-position bad
flag, and either records the flags in the current :class:`~.guard.StepGuard` (no host sync; the
runner raises at its sync point) or, outside a guard, checks them at once and raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenstate.contracts import ConfigError, ContractViolation
from tokenstate.runtime.kernels._launch import require_tensor, same_device, triton_impl, use_triton
from tokenstate.runtime.kernels.guard import current_guard, raise_bad_ids

__all__ = ["GuardedEmbedding", "guarded_embedding", "guarded_embedding_twin"]

_ID_DTYPES = (torch.int32, torch.int64)
_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def guarded_embedding(
    ids: torch.Tensor, weight: torch.Tensor, *, backend: str = "auto"
) -> torch.Tensor:
    """Embed ``ids`` (any shape, int32/int64) with ``weight`` ``[vocab, hidden]``, refusing bad ids.

    Inside a :class:`~.guard.StepGuard` the bad flags are recorded and raised at the runner's sync
    point; outside one they are checked here (a host sync) and an
    :class:`~.guard.EmbeddedBadIdsError` names the flat positions and ids. Rows of bad ids are
    zero in the returned tensor. On CUDA the Triton kernel runs unless autograd needs a backward
    (then the differentiable twin runs; both give the same values).

    Returns:
        ``[*ids.shape, hidden]`` in ``weight``'s dtype.
    """
    fn = "guarded_embedding"
    if not isinstance(ids, torch.Tensor):
        raise ContractViolation(f"{fn}: ids must be a torch.Tensor, got {type(ids).__name__}.")
    if ids.dtype not in _ID_DTYPES:
        raise ContractViolation(
            f"{fn}: ids must be int32 or int64 token ids, got {ids.dtype} {tuple(ids.shape)}."
        )
    require_tensor(fn, "weight", weight, dtypes=_WEIGHT_DTYPES, shape=[None, None])
    if weight.shape[0] == 0:
        raise ContractViolation(f"{fn}: weight has an empty vocabulary ([0, {weight.shape[1]}]).")
    device = same_device(fn, {"ids": ids, "weight": weight})
    flat_ids = ids.reshape(-1)  # [num_tokens]; a copy only when ids is a strided view
    needs_grad = weight.requires_grad and torch.is_grad_enabled()
    if use_triton(fn, backend, device) and not needs_grad:
        out = torch.empty(flat_ids.shape[0], weight.shape[1], dtype=weight.dtype, device=device)
        bad_bytes = torch.empty(flat_ids.shape[0], dtype=torch.int8, device=device)  # [num_tokens]
        triton_impl("_embedding_triton").launch_guarded_embedding(flat_ids, weight, out, bad_bytes)
        bad = bad_bytes.view(torch.bool)  # [num_tokens] bool
    else:
        out, bad = guarded_embedding_twin(flat_ids, weight)
    guard = current_guard()
    if guard is not None:
        guard.record(bad, flat_ids, weight.shape[0])
    elif bool(bad.any()):
        raise_bad_ids(bad, flat_ids, weight.shape[0])
    return out.view(*ids.shape, weight.shape[1])


def guarded_embedding_twin(
    ids: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of the gather: ``ids`` ``[num_tokens]`` → (``[num_tokens, hidden]``, bad flags).

    Differentiable in ``weight``; bad rows get no gradient.
    """
    if ids.device.type == "cpu":
        # Host ids: the bounds check in numpy (a µs, not three torch dispatches), and the common
        # all-good step is one plain gather.
        bad_flags = ids.numpy()  # [num_tokens]
        bad_flags = (bad_flags < 0) | (bad_flags >= weight.shape[0])  # [num_tokens] bool
        bad = torch.from_numpy(bad_flags)
        if not bad_flags.any():
            return F.embedding(ids, weight), bad  # [num_tokens, hidden]
    else:
        bad = (ids < 0) | (ids >= weight.shape[0])  # [num_tokens] bool
    # Row 0 stands in for a bad id only so the lookup stays in bounds; its values are discarded.
    rows = F.embedding(ids.masked_fill(bad, 0), weight)  # [num_tokens, hidden]
    # In-place index_fill over the (usually empty) bad positions: a masked_fill/where with a
    # broadcast [num_tokens, 1] mask rewrites the whole output (~5x the gather itself on the CPU).
    # In place is autograd-safe (the gather's backward does not read its output); nonzero() would
    # sync a CUDA device, but on CUDA the twin only runs when autograd needs it.
    return rows.index_fill_(0, bad.nonzero().flatten(), 0.0), bad


class GuardedEmbedding(nn.Embedding):
    """Drop-in for ``nn.Embedding`` whose forward is :func:`guarded_embedding`.

    Subclassing keeps the ``weight`` parameter name (HF state dicts load unchanged) and every
    ``isinstance(m, nn.Embedding)`` check in HF code (weight init, tying, resizing). Options that
    change the forward (``max_norm``, ``sparse``, ``scale_grad_by_freq``) are refused rather than
    silently ignored. ``padding_idx`` only zeroes that row at initialisation: the guarded forward
    does not mask its gradient (tokenstate's embeddings serve inference).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        _freeze: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise ConfigError(
                "GuardedEmbedding does not support max_norm, scale_grad_by_freq or sparse; build "
                "the embedding without them (inference embeddings never use them)."
            )
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx=padding_idx,
            norm_type=norm_type,
            _weight=_weight,
            _freeze=_freeze,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> GuardedEmbedding:
        """Wrap an existing ``nn.Embedding``'s weight (shared, not copied)."""
        if not isinstance(embedding, nn.Embedding):
            raise ConfigError(
                f"GuardedEmbedding.from_embedding needs an nn.Embedding, got {type(embedding).__name__}."
            )
        guarded = cls(
            embedding.num_embeddings,
            embedding.embedding_dim,
            padding_idx=embedding.padding_idx,
            max_norm=embedding.max_norm,
            scale_grad_by_freq=embedding.scale_grad_by_freq,
            sparse=embedding.sparse,
            _weight=embedding.weight.data,
        )
        guarded.weight = embedding.weight
        return guarded

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return guarded_embedding(input, self.weight)
