"""The Mamba2 mixer: causal depthwise conv + selective state-space scan with grouped B/C heads.

Per token ``t`` of a request (heads ``h``, head dim ``p``, state dim ``n``, group ``g(h)``):

    z, xBC, dt = split(in_proj(u_t))
    xBC        = silu(causal_conv1d(xBC))        # the conv state holds the last K-1 raw inputs
    x, B, C    = split(xBC)                      # B, C: one [n] vector per group of heads
    dt_h       = clamp(softplus(dt_h + dt_bias_h), time_step_limit)
    S_h       <- exp(dt_h * A_h) * S_h + dt_h * outer(x_h, B_g(h))      # A_h = -exp(A_log_h)
    y_h        = S_h @ C_g(h) + D_h * x_h
    out        = out_proj(rmsnorm_per_group(y * silu(z)) * norm.weight)

Both the conv state and the SSM state are per *slot*, so a request's chunked prefill continues
across steps. Rows with speculative drafts advance one position at a time and checkpoint both
states after each (:mod:`tokenstate.models.draft_checkpoints`); the slot's next row restores the
checkpoint after the last accepted draft. One-token rows (decode) are updated together in one vectorised step (gather the
slots' states, update, scatter back); longer rows (prefill chunks) are scanned one row at a time
with the chunked (SSD) form: quadratic inside a chunk of ``chunk_size`` tokens, a recurrence
between chunks — the same numbers as the token recurrence, in far fewer, larger operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.contracts import BatchLayout, ConfigError, ContractViolation, ForwardInput, RowSpan
from tokenstate.models.draft_checkpoints import (
    NO_DRAFTS,
    DraftGroup,
    DraftPlan,
    DraftTracker,
    StateCheckpoints,
)
from tokenstate.models.step_plan import PlanPart, part_tensors, upload_part

__all__ = ["GatedRMSNorm", "Mamba2Mixer", "RecurrentBatch"]


@dataclass(frozen=True, slots=True)
class RecurrentBatch:
    """How a recurrent layer walks one step: one-token rows together, longer rows one by one.

    Attributes:
        single_tokens: ``[num_single]`` int64, flat index of each one-token row's token.
        single_slots: ``[num_single]`` int64, that row's slot.
        chunks: rows with more than one query token and no drafts (prefill chunks), as host ints.
        singles_only: every token of the step is a one-token row, in flat order (decode-only
            step): the layer runs its one-token update on the whole step, no gather or scatter.
        drafts: the step's draft rows and the checkpoints to restore first.
    """

    single_tokens: Tensor | None  # [num_single] int64, execution device
    single_slots: Tensor | None  # [num_single] int64, execution device
    chunks: tuple[RowSpan, ...]
    singles_only: bool = False
    drafts: DraftPlan = NO_DRAFTS

    @classmethod
    def from_input(cls, inp: ForwardInput, tracker: DraftTracker | None = None) -> RecurrentBatch:
        """The step's walk, from the indices the runtime uploaded with it (part ``"recurrent"`` of
        ``inp.layout.indices``); planned and uploaded here only for a forward called without one."""
        drafts = NO_DRAFTS if tracker is None else tracker.plan(inp)
        found = part_tensors(inp, PART)
        if found is None:
            part = cls.plan(inp.layout)
            found = part.meta, upload_part(part.arrays, inp.device)
        meta, tensors = found
        if not isinstance(meta, _RecurrentPlan):
            raise ContractViolation(f"index plan part {PART!r} was not built by RecurrentBatch.plan.")
        if not tensors:
            return cls(None, None, meta.chunks, drafts=drafts)
        single_tokens, single_slots = tensors  # [num_single] int64 each
        return cls(single_tokens, single_slots, meta.chunks, singles_only=meta.singles_only, drafts=drafts)

    @staticmethod
    def plan(layout: BatchLayout) -> PlanPart:
        """On the host: the one-token rows' tokens and slots (index arrays) and the chunk rows."""
        singles = [row for row in layout.rows if row.query_len == 1]
        chunks = tuple(row for row in layout.rows if row.query_len > 1 and row.num_drafts == 0)
        # Rows are consecutive in the flat buffer, so one-token rows covering every token are
        # exactly the tokens 0..T-1 in order.
        meta = _RecurrentPlan(chunks, singles_only=bool(singles) and len(singles) == layout.num_tokens)
        if not singles:
            return PlanPart(meta, ())
        tokens = np.array([r.start for r in singles], dtype=np.int64)
        slots = np.array([r.slot for r in singles], dtype=np.int64)
        return PlanPart(meta, (tokens, slots))


PART = "recurrent"
"""The name of :class:`RecurrentBatch`'s part of a model's index plan."""


@dataclass(frozen=True, slots=True)
class _RecurrentPlan:
    chunks: tuple[RowSpan, ...]
    singles_only: bool


class GatedRMSNorm(nn.Module):
    """``rmsnorm(y * silu(z))`` over groups of ``group_size`` channels, then ``* weight``."""

    def __init__(self, size: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))  # [size]
        self.group_size, self.eps = group_size, eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        gated = (y.float() * F.silu(z.float())).unflatten(-1, (-1, self.group_size))  # [..., G, gs]
        gated = gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * gated.flatten(-2).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """A Mamba2 mixer with HF NemotronH parameter names and per-slot conv/SSM state."""

    def __init__(
        self,
        hidden_size: int,
        *,
        num_heads: int,
        head_dim: int,
        num_groups: int,
        state_size: int,
        conv_kernel: int,
        chunk_size: int,
        time_step_limit: tuple[float, float],
        eps: float,
        bias: bool,
        conv_bias: bool,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.state_size = num_heads, head_dim, state_size
        self.num_groups, self.conv_kernel, self.chunk_size = num_groups, conv_kernel, chunk_size
        self.inner_size = num_heads * head_dim
        self.conv_dim = self.inner_size + 2 * num_groups * state_size
        self.dt_min, self.dt_max = time_step_limit
        self.in_proj = nn.Linear(
            hidden_size, self.inner_size + self.conv_dim + num_heads, bias=bias
        )
        # nn.Conv1d only as the holder of HF's `conv1d.weight` [conv_dim, 1, K] / `conv1d.bias`.
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=conv_bias
        )
        self.dt_bias = nn.Parameter(torch.zeros(num_heads))  # [heads]
        self.A_log = nn.Parameter(torch.zeros(num_heads))  # [heads]
        self.D = nn.Parameter(torch.ones(num_heads))  # [heads]
        self.norm = GatedRMSNorm(self.inner_size, self.inner_size // num_groups, eps)
        self.out_proj = nn.Linear(self.inner_size, hidden_size, bias=bias)
        # Runtime state, not weights: set by allocate_slots.
        self.conv_state: Tensor | None = None  # [num_slots, conv_dim, K - 1] last raw conv inputs
        self.ssm_state: Tensor | None = None  # [num_slots, heads, head_dim, state] float32
        self._checkpoints = StateCheckpoints()  # both states after each draft position

    def allocate_slots(self, num_slots: int) -> None:
        w = self.in_proj.weight
        self.conv_state = w.new_zeros(num_slots, self.conv_dim, self.conv_kernel - 1)
        self.ssm_state = torch.zeros(
            num_slots,
            self.num_heads,
            self.head_dim,
            self.state_size,
            dtype=torch.float32,
            device=w.device,
        )
        self._checkpoints.clear()

    def reset_slot(self, slot: int) -> None:
        if self.conv_state is not None and self.ssm_state is not None:
            self.conv_state[slot].zero_()
            self.ssm_state[slot].zero_()

    def forward(self, u: Tensor, batch: RecurrentBatch) -> Tensor:
        """``[num_tokens, hidden]`` -> ``[num_tokens, hidden]``, advancing each row's slot state."""
        conv_state, ssm_state = self.conv_state, self.ssm_state
        if conv_state is None or ssm_state is None:
            raise ConfigError(
                "Mamba2 mixer has no state: call model.allocate_slots(num_slots) first."
            )
        self._checkpoints.restore(batch.drafts, (conv_state, ssm_state))
        projected = self.in_proj(u)  # [num_tokens, inner + conv_dim + heads]
        z, xbc, dt = projected.split([self.inner_size, self.conv_dim, self.num_heads], dim=-1)
        if batch.singles_only and batch.single_slots is not None:
            y = self._step(xbc, dt, conv_state, ssm_state, batch.single_slots)  # [num_tokens, H, P]
            return self.out_proj(self.norm(y.flatten(1), z))
        y = u.new_empty(u.shape[0], self.num_heads, self.head_dim)  # [num_tokens, heads, head_dim]
        if batch.single_tokens is not None and batch.single_slots is not None:
            idx = batch.single_tokens
            y[idx] = self._step(xbc[idx], dt[idx], conv_state, ssm_state, batch.single_slots)
        for row in batch.chunks:
            rows = slice(row.start, row.end)
            y[rows] = self._scan_row(xbc[rows], dt[rows], conv_state, ssm_state, row.slot)
        for group in batch.drafts.groups:
            self._scan_drafts(xbc, dt, conv_state, ssm_state, group, y)
        return self.out_proj(self.norm(y.flatten(1), z))

    def _scan_drafts(
        self, xbc: Tensor, dt: Tensor, conv_state: Tensor, ssm_state: Tensor, group: DraftGroup,
        y: Tensor,
    ) -> None:
        """Rows with drafts, one position at a time, checkpointing both states after each."""  # fmt: skip
        for position in range(group.length):
            idx = group.tokens(position)  # [G]
            y[idx] = self._step(xbc[idx], dt[idx], conv_state, ssm_state, group.slots)
            self._checkpoints.save(position, group.slots, (conv_state, ssm_state))

    def _split_heads(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``[T, conv_dim]`` -> x ``[T, heads, head_dim]``, B and C ``[T, heads, state]`` (fp32)."""
        gn = self.num_groups * self.state_size
        x, b, c = xbc.float().split([self.inner_size, gn, gn], dim=-1)
        per_group = self.num_heads // self.num_groups  # head h reads group h // per_group
        b = b.unflatten(-1, (self.num_groups, self.state_size)).repeat_interleave(per_group, dim=-2)
        c = c.unflatten(-1, (self.num_groups, self.state_size)).repeat_interleave(per_group, dim=-2)
        return x.unflatten(-1, (self.num_heads, self.head_dim)), b, c

    def _time_steps(self, dt: Tensor) -> Tensor:
        """Raw ``[T, heads]`` -> discretisation steps, clamped to the config's time_step_limit."""
        return F.softplus(dt.float() + self.dt_bias.float()).clamp(self.dt_min, self.dt_max)

    def _step(
        self, xbc: Tensor, dt: Tensor, conv_state: Tensor, ssm_state: Tensor, slots: Tensor
    ) -> Tensor:
        """One token for each of ``R`` rows at once: ``xbc [R, conv_dim]``, ``dt [R, heads]``."""
        window = torch.cat([conv_state[slots], xbc.unsqueeze(-1)], dim=-1)  # [R, conv_dim, K]
        conv_state[slots] = window[:, :, 1:]
        conv = (window * self.conv1d.weight.squeeze(1)).sum(-1)  # [R, conv_dim]
        if self.conv1d.bias is not None:
            conv = conv + self.conv1d.bias
        x, b, c = self._split_heads(F.silu(conv))  # [R, H, P], [R, H, N], [R, H, N]
        step = self._time_steps(dt)  # [R, H]
        decay = torch.exp(step * -torch.exp(self.A_log.float()))  # [R, H]
        state = ssm_state[slots]  # [R, H, P, N]
        state = state * decay[..., None, None] + (step[..., None] * x)[..., None] * b[:, :, None, :]
        ssm_state[slots] = state
        y = (state @ c.unsqueeze(-1)).squeeze(-1) + self.D.float()[:, None] * x  # [R, H, P]
        return y.to(xbc.dtype)

    def _scan_row(
        self, xbc: Tensor, dt: Tensor, conv_state: Tensor, ssm_state: Tensor, slot: int
    ) -> Tensor:
        """A prefill chunk of one row: ``xbc [L, conv_dim]``, ``dt [L, heads]`` -> ``[L, H, P]``."""
        length = xbc.shape[0]
        history = torch.cat([conv_state[slot], xbc.t()], dim=-1)  # [conv_dim, K - 1 + L]
        conv_state[slot] = history[:, length:]
        conv = F.conv1d(
            history.unsqueeze(0), self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim
        )
        x, b, c = self._split_heads(F.silu(conv[0].t()))  # [L, H, P], [L, H, N], [L, H, N]
        step = self._time_steps(dt)  # [L, H]
        log_decay = step * -torch.exp(self.A_log.float())  # [L, H] log of each token's decay
        state = ssm_state[slot]  # [H, P, N] float32
        out = []
        for lo in range(0, length, self.chunk_size):
            hi = min(lo + self.chunk_size, length)
            y, state = _ssd_chunk(
                x[lo:hi], step[lo:hi], log_decay[lo:hi], b[lo:hi], c[lo:hi], state
            )
            out.append(y)
        ssm_state[slot] = state
        y = torch.cat(out) + self.D.float()[:, None] * x  # [L, H, P]
        return y.to(xbc.dtype)


def _ssd_chunk(
    x: Tensor, step: Tensor, log_decay: Tensor, b: Tensor, c: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The recurrence over one chunk in closed form.

    With ``a_t`` the cumulative log decay from the chunk start through token ``t``:
    ``y_t = sum_{s<=t} exp(a_t - a_s) dt_s (C_t.B_s) x_s + exp(a_t) C_t.S0`` and the state after
    the chunk is ``exp(a_end) S0 + sum_s exp(a_end - a_s) dt_s outer(x_s, B_s)``.

    Args: x ``[l, H, P]``, step/log_decay ``[l, H]``, b/c ``[l, H, N]``, state ``[H, P, N]``.
    Returns: y ``[l, H, P]`` (without the D skip) and the new state ``[H, P, N]``.
    """
    cum = torch.cumsum(log_decay, dim=0)  # [l, H]
    length = x.shape[0]
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()  # [t, s]
    # Mask before exp: for s > t the difference is positive and could overflow to inf.
    gaps = cum[:, None, :] - cum[None, :, :]  # [t, s, H]
    gaps = gaps.masked_fill(~causal[..., None], float("-inf"))
    scores = torch.einsum("thn,shn->tsh", c, b) * torch.exp(gaps) * step[None, :, :]  # [t, s, H]
    y = torch.einsum("tsh,shp->thp", scores, x)  # [l, H, P]
    y = y + torch.exp(cum)[..., None] * torch.einsum("thn,hpn->thp", c, state)
    to_end = torch.exp(cum[-1][None, :] - cum) * step  # [l, H]
    state = torch.exp(cum[-1])[:, None, None] * state + torch.einsum(
        "sh,shp,shn->hpn", to_end, x, b
    )
    return y, state
