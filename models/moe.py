"""Sparse mixture-of-experts MLP: sigmoid router with group-limited top-k, plus shared experts.

Routing (DeepSeek-V3 style, used by Kimi-Linear)::

    score    = sigmoid(W_router x)                      # [experts], float32
    choice   = score + correction_bias                  # bias steers *which* experts, not weights
    groups   = top num_groups_kept groups by the sum of each group's two best choices
    chosen   = top_k experts by choice inside the kept groups
    weight   = score[chosen] (renormalised to sum 1 if asked) * routed_scaling_factor
    y        = sum_chosen weight_e * expert_e(x) + shared_experts(x)

Experts are stored stacked (``[experts, ...]``) and every expert is applied to every token, with
zero weight where it was not chosen: no data-dependent shapes, so no host sync and no per-expert
Python loop. That costs ``experts / top_k`` times the routed FLOPs — right for a reference model at
test sizes, wrong for serving a full-size checkpoint (which wants a grouped-GEMM kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.models.layers import ACTIVATIONS, GatedMLP

__all__ = ["GroupedTopKRouter", "SharedExpertMoE", "StackedExperts", "grouped_topk"]


def grouped_topk(
    scores: Tensor,
    correction_bias: Tensor,
    *,
    num_groups: int,
    topk_groups: int,
    top_k: int,
    renormalize: bool,
    scaling: float,
) -> tuple[Tensor, Tensor]:
    """Pick ``top_k`` experts per token within the best ``topk_groups`` expert groups.

    Args:
        scores: ``[num_tokens, experts]`` float32 router probabilities (after sigmoid).
        correction_bias: ``[experts]`` added to the scores for selection only.

    Returns:
        ``[num_tokens, top_k]`` float32 weights and ``[num_tokens, top_k]`` int64 expert indices.
    """
    n, experts = scores.shape
    choice = scores + correction_bias  # [T, experts]
    per_group = choice.view(n, num_groups, experts // num_groups)  # [T, groups, experts/group]
    group_strength = per_group.topk(2, dim=-1).values.sum(dim=-1)  # [T, groups]
    kept_groups = group_strength.topk(topk_groups, dim=-1).indices  # [T, topk_groups]
    group_kept = torch.zeros_like(group_strength, dtype=torch.bool).scatter_(1, kept_groups, True)
    expert_kept = group_kept.repeat_interleave(experts // num_groups, dim=1)  # [T, experts]
    indices = choice.masked_fill(~expert_kept, float("-inf")).topk(top_k, dim=-1).indices  # [T, k]
    weights = scores.gather(1, indices)  # [T, k]
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, indices


class GroupedTopKRouter(nn.Module):
    """The router (HF names: ``gate.weight``, ``gate.e_score_correction_bias``)."""

    def __init__(
        self, hidden_size: int, num_experts: int, *, num_groups: int, topk_groups: int, top_k: int,
        renormalize: bool, scaling: float,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))  # [experts, hidden]
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))  # [experts] float32
        self.num_groups, self.topk_groups, self.top_k = num_groups, topk_groups, top_k
        self.renormalize, self.scaling = renormalize, scaling

    def forward(self, x: Tensor) -> Tensor:
        """``[num_tokens, experts]`` float32 combine weights (zero for experts not chosen)."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))  # [T, experts]
        weights, indices = grouped_topk(
            scores, self.e_score_correction_bias.float(), num_groups=self.num_groups,
            topk_groups=self.topk_groups, top_k=self.top_k, renormalize=self.renormalize,
            scaling=self.scaling,
        )
        return torch.zeros_like(scores).scatter_(1, indices, weights)


class StackedExperts(nn.Module):
    """Gated experts ``w2(act(w1 x) * w3 x)`` stored stacked; the checkpoint keeps them per expert."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, act: str) -> None:
        super().__init__()
        self.act = ACTIVATIONS[act]
        self.w1 = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))  # gate
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))  # down
        self.w3 = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))  # up

    def forward(self, x: Tensor, combine: Tensor) -> Tensor:
        """``x``: ``[num_tokens, hidden]``; ``combine``: ``[num_tokens, experts]`` → ``[num_tokens, hidden]``."""
        gate = torch.einsum("th,eih->tei", x, self.w1)  # [T, experts, intermediate]
        up = torch.einsum("th,eih->tei", x, self.w3)  # [T, experts, intermediate]
        hidden = self.act(gate) * up * combine.to(x.dtype).unsqueeze(-1)  # [T, experts, intermediate]
        return torch.einsum("tei,ehi->th", hidden, self.w2)


class SharedExpertMoE(nn.Module):
    """Routed experts plus always-on shared experts (HF: ``block_sparse_moe``)."""

    def __init__(
        self, hidden_size: int, *, num_experts: int, expert_intermediate_size: int,
        num_shared_experts: int, num_groups: int, topk_groups: int, top_k: int, renormalize: bool,
        scaling: float, act: str,
    ) -> None:
        super().__init__()
        self.gate = GroupedTopKRouter(
            hidden_size, num_experts, num_groups=num_groups, topk_groups=topk_groups, top_k=top_k,
            renormalize=renormalize, scaling=scaling,
        )
        self.experts = StackedExperts(num_experts, hidden_size, expert_intermediate_size, act)
        self.shared_experts = GatedMLP(
            hidden_size, expert_intermediate_size * num_shared_experts, bias=False, act=act
        )

    def forward(self, x: Tensor) -> Tensor:
        """``[num_tokens, hidden]`` → ``[num_tokens, hidden]``."""
        return self.experts(x, self.gate(x)) + self.shared_experts(x)
