"""NemotronH's blocks: one pre-norm residual block per layer around one mixer.

A layer's mixer is what ``layers_block_type`` says: a Mamba2 mixer (``linear_attention``),
grouped-query attention *without* rotary positions (``full_attention``; order comes from the
Mamba layers), a squared-ReLU MLP (``mlp``) or a mixture of squared-ReLU experts (``moe``).
Parameter names are those of NemotronH checkpoints (``mixer.in_proj``, ``mixer.experts.3.up_proj``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.contracts import ConfigError
from tokenstate.models.layers import RMSNorm, SlotAttention, slot_attention
from tokenstate.models.mamba2 import Mamba2Mixer, RecurrentBatch
from tokenstate.models.moe import GroupedTopKRouter
from tokenstate.models.slot_batch import SlotBatch

__all__ = [
    "NemotronHAttention",
    "NemotronHBlock",
    "NemotronHMoE",
    "NemotronHStep",
    "ReluSquaredMLP",
]


@dataclass(frozen=True, slots=True)
class NemotronHStep:
    """Per-step indices every layer shares: attention's slot batch and the recurrent row split."""

    attention: SlotBatch
    recurrent: RecurrentBatch


class NemotronHAttention(SlotAttention):
    """Grouped-query attention over the slot's KV cache, with no positional rotation."""

    def forward(self, x: Tensor, batch: SlotBatch) -> Tensor:  # type: ignore[override]
        if self.k_cache is None or self.v_cache is None:
            raise ConfigError(
                "attention has no KV cache: call model.allocate_slots(num_slots) first."
            )
        n = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self._qkv(x, (self.q_proj, self.k_proj, self.v_proj)).view(
            n, heads + 2 * kv_heads, self.head_dim
        )  # [T, heads + 2 * kv_heads, head_dim]: q, k, v heads side by side (one matmul)
        q, k, v = qkv.split((heads, kv_heads, kv_heads), dim=1)  # [T, heads | kv_heads, head_dim]
        out = slot_attention(q, k, v, self.k_cache, self.v_cache, batch, self.scale)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class ReluSquaredMLP(nn.Module):
    """``down(relu(up(x))**2)`` — NemotronH's MLP and each of its experts (no gate projection)."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.relu(self.up_proj(x)).square())


class NemotronHMoE(nn.Module):
    """Routed squared-ReLU experts (optionally in a latent space) plus one shared expert."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        hidden, latent = s["hidden_size"], s["moe_latent_size"] or s["hidden_size"]
        self.gate = GroupedTopKRouter(
            hidden,
            s["n_routed_experts"],
            num_groups=s["n_group"],
            topk_groups=s["topk_group"],
            top_k=s["num_experts_per_tok"],
            renormalize=s["norm_topk_prob"],
            scaling=s["routed_scaling_factor"],
        )
        self.experts = nn.ModuleList(
            ReluSquaredMLP(latent, s["moe_intermediate_size"], bias=False)
            for _ in range(s["n_routed_experts"])
        )
        self.shared_experts = ReluSquaredMLP(
            hidden, s["moe_shared_expert_intermediate_size"], bias=s["mlp_bias"]
        )
        self.fc1_latent_proj: nn.Module = nn.Identity()
        self.fc2_latent_proj: nn.Module = nn.Identity()
        if s["moe_latent_size"] is not None:
            self.fc1_latent_proj = nn.Linear(hidden, latent, bias=s["mlp_bias"])
            self.fc2_latent_proj = nn.Linear(latent, hidden, bias=s["mlp_bias"])

    def forward(self, x: Tensor) -> Tensor:
        weights = self.gate(x)  # [T, E] float32
        latent = self.fc1_latent_proj(x)  # [T, latent]
        routed = torch.zeros(latent.shape, dtype=torch.float32, device=x.device)  # [T, latent]
        # Every expert runs on every token and unchosen ones are weighted 0: the shapes stay
        # static, so there is no data-dependent gather and no host sync (a reference model's
        # trade: experts/top_k times the FLOPs of a grouped kernel).
        for e, expert in enumerate(self.experts):
            routed = routed + weights[:, e : e + 1] * expert(latent).float()
        return self.fc2_latent_proj(routed.to(x.dtype)) + self.shared_experts(x)


class NemotronHBlock(nn.Module):
    """``h + mixer(norm(h))`` with the mixer chosen by the layer type."""

    def __init__(self, layer_type: str, s: dict[str, Any]) -> None:
        super().__init__()
        hidden = s["hidden_size"]
        self.layer_type = layer_type
        self.norm = RMSNorm(hidden, s["layer_norm_epsilon"])
        self.mixer: nn.Module
        if layer_type == "linear_attention":
            self.mixer = Mamba2Mixer(
                hidden,
                num_heads=s["mamba_num_heads"],
                head_dim=s["mamba_head_dim"],
                num_groups=s["n_groups"],
                state_size=s["ssm_state_size"],
                conv_kernel=s["conv_kernel"],
                chunk_size=s["chunk_size"],
                time_step_limit=s["time_step_limit"],
                eps=s["layer_norm_epsilon"],
                bias=s["use_bias"],
                conv_bias=s["use_conv_bias"],
            )
        elif layer_type == "full_attention":
            self.mixer = NemotronHAttention(
                hidden,
                s["num_attention_heads"],
                s["num_key_value_heads"],
                s["head_dim"],
                bias=False,
            )
        elif layer_type == "mlp":
            self.mixer = ReluSquaredMLP(hidden, s["intermediate_size"], bias=s["mlp_bias"])
        elif layer_type == "moe":
            self.mixer = NemotronHMoE(s)
        else:
            raise ConfigError(f"NemotronH: unknown layer type {layer_type!r}.")

    def forward(self, hidden: Tensor, step: NemotronHStep) -> Tensor:
        normed = self.norm(hidden)  # [num_tokens, hidden]
        if isinstance(self.mixer, Mamba2Mixer):
            return hidden + self.mixer(normed, step.recurrent)
        if isinstance(self.mixer, NemotronHAttention):
            return hidden + self.mixer(normed, step.attention)
        return hidden + self.mixer(normed)

    def allocate_slots(self, num_slots: int, max_model_len: int) -> None:
        if isinstance(self.mixer, Mamba2Mixer):
            self.mixer.allocate_slots(num_slots)
        elif isinstance(self.mixer, NemotronHAttention):
            self.mixer.allocate_slots(num_slots, max_model_len)

    def reset_slot(self, slot: int) -> None:
        if isinstance(self.mixer, Mamba2Mixer | NemotronHAttention):
            self.mixer.reset_slot(slot)
