"""MLA (multi-head latent attention), Kimi-Linear's full-attention mixer, with a per-slot cache.

Keys and values are projected through a low-rank latent shared by all heads::

    latent, k_shared = split(W_kv_a x)                   # [kv_lora_rank], [qk_rope_head_dim]
    k_nope, v        = split(W_kv_b rmsnorm(latent))     # per head: [qk_nope_head_dim], [v_head_dim]
    k                = concat(k_nope, k_shared)          # k_shared is the same for every head
    q                = W_q x   (or W_qb rmsnorm(W_qa x) with a query latent)

Kimi-Linear's MLA layers use no position embedding at all (NoPE): the "rope" part of the key is
kept only as a head-shared slice, never rotated; positions matter only through the causal mask
and the cache cell each token writes. The cache holds the expanded per-head K/V of every slot —
more memory than caching the latent, but a decode step then reads the cache directly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tokenstate.contracts import ConfigError
from tokenstate.models.layers import RMSNorm, allocate_kv_cache, slot_attention
from tokenstate.models.slot_batch import SlotBatch

__all__ = ["LATENT_NORM_EPS", "MultiHeadLatentAttention"]

LATENT_NORM_EPS = 1e-6
"""The latent norms use a fixed epsilon, not the config's rms_norm_eps (as HF's reference does)."""


class MultiHeadLatentAttention(nn.Module):
    """MLA with HF parameter names (``q_proj``/``q_a_proj``…, ``kv_a_proj_with_mqa``, ``kv_b_proj``)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        bias: bool,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = v_head_dim, kv_lora_rank
        self.scale = self.qk_head_dim**-0.5
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, num_heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(q_lora_rank, num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=bias)
        # Runtime state, not weights (kept out of the state dict): set by allocate_slots.
        self.k_cache: Tensor | None = None  # [num_slots, heads, max_model_len, qk_head_dim]
        self.v_cache: Tensor | None = None  # [num_slots, heads, max_model_len, v_head_dim]

    def allocate_slots(self, num_slots: int, max_model_len: int) -> None:
        w, heads = self.kv_b_proj.weight, self.num_heads
        self.k_cache = allocate_kv_cache(num_slots, heads, max_model_len, self.qk_head_dim, like=w)
        self.v_cache = allocate_kv_cache(num_slots, heads, max_model_len, self.v_head_dim, like=w)

    def reset_slot(self, slot: int) -> None:
        # Attention only reads a slot's cells [0, seq_len), all rewritten by the new request; zeroing
        # keeps a reused slot free of the previous request's values anyway (cheap, once per admission).
        if self.k_cache is not None and self.v_cache is not None:
            self.k_cache[slot].zero_()
            self.v_cache[slot].zero_()

    def forward(self, x: Tensor, batch: SlotBatch) -> Tensor:
        """``x``: ``[num_tokens, hidden]`` (normed input) → ``[num_tokens, hidden]``."""
        if self.k_cache is None or self.v_cache is None:
            raise ConfigError("MLA layer has no KV cache: call model.allocate_slots(num_slots) first.")
        n, heads = x.shape[0], self.num_heads
        if self.q_proj is not None:
            q = self.q_proj(x)  # [T, heads * qk_head_dim]
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None and self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        latent, k_shared = self.kv_a_proj_with_mqa(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1
        )  # [T, kv_lora_rank], [T, qk_rope_head_dim]
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(n, heads, -1)  # [T, heads, nope + v]
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_shared[:, None, :].expand(n, heads, -1)], dim=-1)  # [T, heads, qk]
        out = slot_attention(
            q.view(n, heads, self.qk_head_dim), k, v, self.k_cache, self.v_cache, batch, self.scale
        )  # [T, heads, v_head_dim]
        return self.o_proj(out.reshape(n, heads * self.v_head_dim))
