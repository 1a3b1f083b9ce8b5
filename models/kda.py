"""KDA (Kimi Delta Attention): Kimi-Linear's linear-attention mixer, with per-slot state.

Per head, with key channels ``i`` and value channels ``j``, for each token ``t``::

    q, k, v   = act(short causal depthwise conv over time of (W_q x, W_k x, W_v x))  (act: hidden_act, silu in Kimi)
    q, k      = l2-normalised per head; q scaled by d_k ** -0.5
    g_t       = -exp(A_log) * softplus(W_fb W_fa x_t + dt_bias)     # per key channel, <= 0
    beta_t    = sigmoid(W_b x_t)                                     # per head write strength
    S         = diag(exp(g_t)) S                                     # per-channel forgetting
    S         = S + beta_t * k_t (v_t - S^T k_t)^T                   # delta rule
    o_t       = S^T q_t
    y_t       = W_o [rmsnorm(o_t) * sigmoid(W_gb W_ga x_t)]          # gated per-head norm

State kept per slot: the last ``K - 1`` conv inputs and ``S`` (float32, it accumulates over the whole
request). Both continue across chunked-prefill steps; ``reset_slot`` zeroes them on admission.
Rows with speculative drafts advance one position at a time and checkpoint both states after each
(:mod:`tokenstate.models.draft_checkpoints`); the slot's next row restores the checkpoint after the
last accepted draft.
Parameter names are the HF checkpoint names (``q_conv1d`` etc. are fused into ``conv_weight`` and
split again by the weight map in :mod:`tokenstate.models.kimi_linear`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.contracts import BatchLayout, ConfigError, ContractViolation, ForwardInput, RowSpan
from tokenstate.models.draft_checkpoints import DraftGroup, DraftPlan, StateCheckpoints
from tokenstate.models.fused_linear import FusedProjection
from tokenstate.models.layers import ACTIVATIONS
from tokenstate.models.step_plan import PlanPart, part_tensors, upload_part

__all__ = [
    "KimiDeltaAttention",
    "RecurrentGroup",
    "delta_rule_scan",
    "plan_recurrent_groups",
    "recurrent_groups",
    "short_conv",
]


@dataclass(frozen=True, slots=True)
class RecurrentGroup:
    """Rows of one step that have the same query length, advanced by one batched scan.

    A recurrence cannot pad a row (a padding token would enter the state), so rows are grouped by
    exact length instead: all decode rows form one group of length 1; a prefill chunk usually forms
    its own group, addressed by slices (no index upload at all).
    """

    length: int
    num_rows: int
    tokens: Tensor | slice  # [num_rows * length] int64 flat token indices, row-major (or a slice)
    slots: Tensor | slice  # [num_rows] int64 slots (or slice(slot, slot + 1))


def recurrent_groups(inp: ForwardInput, *, num_slots: int) -> tuple[RecurrentGroup, ...]:
    """Group the step's rows without drafts by query length (draft rows go through a
    :class:`~tokenstate.models.draft_checkpoints.DraftPlan`), over the index tensors the runtime
    uploaded with the step (part ``"recurrent"`` of ``inp.layout.indices``); planned and uploaded
    here only for a forward called without one."""
    found = part_tensors(inp, PART)
    if found is None:
        part = plan_recurrent_groups(inp.layout, num_slots=num_slots)
        found = part.meta, upload_part(part.arrays, inp.device)
    meta, tensors = found
    if not isinstance(meta, _GroupsPlan):
        raise ContractViolation(f"index plan part {PART!r} was not built by plan_recurrent_groups.")
    groups, taken = [], 0
    for length, num_rows, tokens, slots in meta.groups:
        if tokens is None:
            groups.append(RecurrentGroup(length, num_rows, tensors[taken], tensors[taken + 1]))
            taken += 2
        else:
            groups.append(RecurrentGroup(length, num_rows, tokens, slots))
    return tuple(groups)


PART = "recurrent"
"""The name of the recurrent groups' part of a model's index plan."""


@dataclass(frozen=True, slots=True)
class _GroupsPlan:
    # (length, num_rows, token slice, slot slice) per group; slices None: the next two tensors
    groups: tuple[tuple[int, int, slice | None, slice | None], ...]


def plan_recurrent_groups(layout: BatchLayout, *, num_slots: int) -> PlanPart:
    """On the host: the groups by query length, and the index arrays of those with several rows (a
    single-row group is addressed by slices: no index at all)."""
    bad = [r for r in layout.rows if not 0 <= r.slot < num_slots]
    if bad:
        raise ContractViolation(
            f"rows {[r.row for r in bad]} use slots {[r.slot for r in bad]}, outside the {num_slots} "
            "allocated slots; call model.allocate_slots with enough slots."
        )
    by_length: dict[int, list[RowSpan]] = {}
    for row in layout.rows:
        if row.num_drafts == 0:
            by_length.setdefault(row.query_len, []).append(row)
    arrays: list[np.ndarray] = []
    groups: list[tuple[int, int, slice | None, slice | None]] = []
    for length, rows in by_length.items():
        if len(rows) == 1:
            r = rows[0]
            groups.append((length, 1, slice(r.start, r.end), slice(r.slot, r.slot + 1)))
        else:
            starts = np.array([r.start for r in rows], dtype=np.int64)
            arrays.append((starts[:, None] + np.arange(length)).reshape(-1))  # [G * L] row-major
            arrays.append(np.array([r.slot for r in rows], dtype=np.int64))  # [G]
            groups.append((length, len(rows), None, None))
    return PlanPart(_GroupsPlan(tuple(groups)), tuple(arrays))


def short_conv(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv + activation (the config's ``hidden_act``, as HF applies it) of rows
    that all have ``L`` new tokens.

    Args:
        x: ``[rows, channels, L]`` new inputs.
        conv_state: ``[rows, channels, K - 1]`` the inputs before them (zeros on a fresh slot).
        weight: ``[channels, K]`` per-channel taps, oldest first.

    Returns:
        ``[rows, channels, L]`` activated outputs and the new ``[rows, channels, K - 1]`` state.
    """
    window = torch.cat([conv_state, x], dim=-1)  # [rows, channels, K - 1 + L]
    out = F.conv1d(window, weight.unsqueeze(1), groups=weight.shape[0])  # [rows, channels, L]
    return act(out), window[..., window.shape[-1] - conv_state.shape[-1] :]


def delta_rule_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over ``L`` steps for a batch of rows (float32 throughout).

    Args:
        q, k: ``[rows, L, heads, d_k]`` (already normalised; q already scaled).
        v: ``[rows, L, heads, d_v]``.
        g: ``[rows, L, heads, d_k]`` log decay per key channel.
        beta: ``[rows, L, heads]`` write strength.
        state: ``[rows, heads, d_k, d_v]`` state before the first step.

    Returns:
        ``[rows, L, heads, d_v]`` outputs and the ``[rows, heads, d_k, d_v]`` state after the last step.
    """
    outputs = []
    decay = g.exp().unsqueeze(-1)  # [rows, L, heads, d_k, 1]
    for t in range(q.shape[1]):
        state = state * decay[:, t]
        k_t = k[:, t]  # [rows, heads, d_k]
        # matmul, not einsum: the same batched product without einsum's per-call parsing.
        recalled = torch.matmul(k_t.unsqueeze(-2), state).squeeze(-2)  # [rows, heads, d_v]
        correction = (v[:, t] - recalled) * beta[:, t].unsqueeze(-1)  # [rows, heads, d_v]
        state = state + k_t.unsqueeze(-1) * correction.unsqueeze(-2)
        outputs.append(torch.matmul(q[:, t].unsqueeze(-2), state).squeeze(-2))  # [rows, heads, d_v]
    return torch.stack(outputs, dim=1), state


def _l2_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps inside the square root (not a max() floor), as the reference FLA kernels do.
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class KimiDeltaAttention(nn.Module):
    """One KDA layer; per-slot conv and recurrent state are sized by :meth:`allocate_slots`."""

    def __init__(
        self, hidden_size: int, num_heads: int, head_dim: int, conv_kernel: int, rms_norm_eps: float,
        act: str = "silu",
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {act!r} is not supported; use one of {sorted(ACTIVATIONS)}.")
        self.conv_act = ACTIVATIONS[act]  # HF applies the config's hidden_act to the short conv
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.conv_kernel = conv_kernel
        self.rms_norm_eps = rms_norm_eps
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(hidden_size, inner, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(3 * inner, conv_kernel))  # [q|k|v channels, K]
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, inner, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(inner))  # [heads * d_k]
        self.A_log = nn.Parameter(torch.empty(1, 1, num_heads, 1))  # the HF checkpoint's shape
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, inner, bias=False)
        self.o_norm_weight = nn.Parameter(torch.ones(head_dim))  # [d_v]; saved as o_norm.weight
        self.o_proj = nn.Linear(inner, hidden_size, bias=False)
        # Runtime state, not weights (kept out of the state dict): set by allocate_slots.
        self.conv_state: Tensor | None = None  # [num_slots, 3 * inner, K - 1]
        self.recurrent_state: Tensor | None = None  # [num_slots, heads, d_k, d_v] float32
        self._x_projections = FusedProjection()  # q/k/v/f_a/g_a/b of x in one matmul
        self._checkpoints = StateCheckpoints()  # both states after each draft position

    def allocate_slots(self, num_slots: int) -> None:
        w = self.q_proj.weight
        inner = self.num_heads * self.head_dim
        self.conv_state = w.new_zeros(num_slots, 3 * inner, self.conv_kernel - 1)
        self.recurrent_state = torch.zeros(
            num_slots, self.num_heads, self.head_dim, self.head_dim, dtype=torch.float32, device=w.device
        )
        self._checkpoints.clear()

    def reset_slot(self, slot: int) -> None:
        if self.conv_state is not None and self.recurrent_state is not None:
            self.conv_state[slot].zero_()
            self.recurrent_state[slot].zero_()

    def forward(
        self, x: Tensor, groups: tuple[RecurrentGroup, ...], drafts: DraftPlan | None = None
    ) -> Tensor:
        """``x``: ``[num_tokens, hidden]`` (normed input) → ``[num_tokens, hidden]``."""
        conv_state, recurrent_state = self.conv_state, self.recurrent_state
        if conv_state is None or recurrent_state is None:
            raise ConfigError("KDA layer has no state: call model.allocate_slots(num_slots) first.")
        if drafts is not None:
            self._checkpoints.restore(drafts, (conv_state, recurrent_state))
        n, heads, d = x.shape[0], self.num_heads, self.head_dim
        inner = heads * d
        # Every projection of x in one matmul: [T, 3 * inner (q|k|v) + d (f_a) + d (g_a) + heads (b)].
        projected = self._x_projections(
            x, (self.q_proj, self.k_proj, self.v_proj, self.f_a_proj, self.g_a_proj, self.b_proj)
        )
        mixed = projected[:, : 3 * inner]  # [T, 3 * inner]
        f_a, g_a, b = projected[:, 3 * inner :].split((d, d, heads), dim=-1)
        log_decay = -self.A_log.view(heads, 1).float().exp() * F.softplus(
            (self.f_b_proj(f_a).float() + self.dt_bias.float()).view(n, heads, d)
        )  # [T, heads, d_k]
        beta = torch.sigmoid(b.float())  # [T, heads]
        core = torch.empty(n, heads, d, dtype=torch.float32, device=x.device)  # [T, heads, d_v]

        for group in groups:
            rows, length = group.num_rows, group.length
            chunk = mixed[group.tokens].view(rows, length, -1).transpose(1, 2)  # [G, 3 * inner, L]
            conv_out, conv_state[group.slots] = short_conv(
                chunk, conv_state[group.slots], self.conv_weight, self.conv_act
            )  # [G, 3 * inner, L]
            q, k, v = conv_out.transpose(1, 2).float().reshape(rows, length, 3, heads, d).unbind(2)
            out, recurrent_state[group.slots] = delta_rule_scan(
                _l2_normalise(q) * d**-0.5,
                _l2_normalise(k),
                v,
                log_decay[group.tokens].view(rows, length, heads, d),
                beta[group.tokens].view(rows, length, heads),
                recurrent_state[group.slots],
            )  # [G, L, heads, d_v]
            core[group.tokens] = out.reshape(rows * length, heads, d)
        for draft_group in drafts.groups if drafts is not None else ():
            self._scan_drafts(mixed, log_decay, beta, draft_group, core)

        normed = core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + self.rms_norm_eps)
        gate = torch.sigmoid(self.g_b_proj(g_a).float()).view(n, heads, d)
        gated = (normed * self.o_norm_weight.float() * gate).to(x.dtype)  # [T, heads, d_v]
        return self.o_proj(gated.reshape(n, heads * d))

    def _scan_drafts(
        self, mixed: Tensor, log_decay: Tensor, beta: Tensor, group: DraftGroup, core: Tensor
    ) -> None:
        """Rows with drafts, one position at a time, checkpointing both states after each.

        ``mixed [T, 3 * inner]``, ``log_decay [T, heads, d_k]``, ``beta [T, heads]``; writes ``core``.
        """
        conv_state, recurrent_state = self.conv_state, self.recurrent_state
        assert conv_state is not None and recurrent_state is not None
        heads, d, slots = self.num_heads, self.head_dim, group.slots
        for position in range(group.length):
            idx = group.tokens(position)  # [G]
            conv_out, conv_state[slots] = short_conv(
                mixed[idx].unsqueeze(-1), conv_state[slots], self.conv_weight, self.conv_act
            )  # [G, 3 * inner, 1]
            q, k, v = conv_out.squeeze(-1).float().view(-1, 3, heads, d).unbind(1)  # [G, heads, d] each
            out, recurrent_state[slots] = delta_rule_scan(
                (_l2_normalise(q) * d**-0.5).unsqueeze(1), _l2_normalise(k).unsqueeze(1), v.unsqueeze(1),
                log_decay[idx].unsqueeze(1), beta[idx].unsqueeze(1), recurrent_state[slots],
            )  # [G, 1, heads, d_v]  # fmt: skip
            core[idx] = out.squeeze(1)
            self._checkpoints.save(position, slots, (conv_state, recurrent_state))
