"""Shared building blocks: RMSNorm, rotary embeddings, a gated MLP and per-slot KV-cache attention.

Every model in :mod:`tokenstate.models` composes these. Parameter names follow HF (``q_proj``,
``gate_proj``, ``weight``, …) so that checkpoints load by name. Per-request state is indexed by
**slot** (see :mod:`tokenstate.models.slot_batch` for the per-step indices the attention reads).
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.contracts import ConfigError
from tokenstate.models.compiled import OpaqueSites, current_attention_batch, opaque_call
from tokenstate.models.cpu_memory import huge_page_zeros
from tokenstate.models.fused_linear import FusedProjection
from tokenstate.models.slot_batch import LongRow, ShortRows, SlotBatch

__all__ = [
    "ACTIVATIONS", "GatedMLP", "RMSNorm", "RotaryEmbedding", "SlotAttention", "allocate_kv_cache", "slot_attention",
]  # fmt: skip

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 whatever the activation dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))  # [hidden]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # Nothing to cast: one fused op, bit-identical to the scale-after-normalise below.
            return F.rms_norm(x, (x.shape[-1],), self.weight, eps=self.eps)  # [..., hidden]
        # Normalise in float32, cast back, then scale: the order HF checkpoints were trained with.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)  # [..., hidden] float32
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the "rotate halves" layout HF checkpoints are stored in.

    The cos/sin of every position up to ``max_positions`` are tabulated once (float32) so a step
    only gathers rows by position. The tables are non-persistent buffers: they follow ``.to()``
    but are not weights, so they stay out of the state dict.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device) -> None:
        super().__init__()
        if head_dim % 2:
            raise ConfigError(f"rotary embedding needs an even head_dim, got {head_dim}.")
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        inv_freq = 1.0 / (theta**exponents)  # [head_dim / 2]
        pos = torch.arange(max_positions, dtype=torch.float32, device=device)  # [max_positions]
        angles = pos[:, None] * inv_freq[None, :]  # [max_positions, head_dim / 2]
        angles = torch.cat((angles, angles), dim=-1)  # [max_positions, head_dim]
        half = head_dim // 2
        # The sign of "rotate halves" is folded into the sine table once, so a step rotates with one
        # roll instead of a negate and a concatenation.
        signed_sin = torch.cat((-angles[:, :half].sin(), angles[:, half:].sin()), dim=-1)
        self.cos_table: Tensor  # [max_positions, head_dim] float32
        self.signed_sin_table: Tensor  # [max_positions, head_dim] float32: -sin, then +sin
        self.register_buffer("cos_table", angles.cos(), persistent=False)
        self.register_buffer("signed_sin_table", signed_sin, persistent=False)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``[num_tokens, 1, head_dim]`` cos and signed sin (``-sin`` on the first half, ``+sin`` on
        the second) for ``positions`` (``[num_tokens]`` int); :meth:`rotate` takes them as they are.
        """
        return self.cos_table[positions].unsqueeze(1), self.signed_sin_table[positions].unsqueeze(1)

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        """Rotate ``x`` (``[num_tokens, heads, head_dim]``) by the angles of its positions.

        ``x * cos + cat(-x2, x1) * sin`` of the halves layout, as ``x * cos + cat(x2, x1) *
        signed_sin``: bit-identical, since negating a factor only flips the product's sign.
        """
        swapped = x.roll(x.shape[-1] // 2, dims=-1)  # [num_tokens, heads, head_dim]: halves swapped
        rotated = x * cos + swapped * signed_sin  # [num_tokens, heads, head_dim] float32
        return rotated if rotated.dtype == x.dtype else rotated.to(x.dtype)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` — the SwiGLU feed-forward of Llama-style blocks."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool, act: str) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {act!r} is not supported; use one of {sorted(ACTIVATIONS)}.")
        with warnings.catch_warnings():
            # A zero-width MLP (Kimi's n_shared_experts=0) keeps HF's zero-size tensors, uninitialised.
            warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = ACTIVATIONS[act]
        self.intermediate_size = intermediate_size
        self._gate_up = FusedProjection()  # gate and up in one matmul (weights stay HF-named)
        self._down = FusedProjection()  # down_proj, pre-packed where that pays
        # Inside a compiled graph: the call id of the opaque op that runs the whole MLP, used where
        # both projections would be opaque calls anyway (see make_opaque).
        self._block_op: int | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.intermediate_size == 0:  # no hidden units: down_proj's bias (or zeros), as HF computes
            return self.down_proj(x.new_zeros(*x.shape[:-1], 0))
        if self._block_op is not None and torch.compiler.is_compiling() and x.dim() == 2:
            if self._gate_up.opaque_in_graph() and self._down.opaque_in_graph():
                return opaque_call(self._block_op, (x,), (x.shape[1],))  # [num_tokens, hidden]
        gate, up = self._gate_up(x, (self.gate_proj, self.up_proj)).split(
            self.intermediate_size, dim=-1
        )  # [..., intermediate] each
        hidden = self.act(gate)  # [..., intermediate]
        # In place when nothing records gradients: the same products, without a prefill-sized
        # temporary per layer (prefill 3 % faster on the tiny model); autograd needs the copy.
        hidden = hidden * up if torch.is_grad_enabled() else hidden.mul_(up)
        return self._down(hidden, (self.down_proj,))

    def projections(self) -> list[tuple[FusedProjection, tuple[nn.Linear, ...]]]:
        """Each fused projection with the linears it computes."""
        return [(self._gate_up, (self.gate_proj, self.up_proj)), (self._down, (self.down_proj,))]

    def prepack_linears(self) -> None:
        for projection, linears in self.projections():
            projection.prepare(linears)

    def make_opaque(self, sites: OpaqueSites) -> None:
        """Make the projections compile (:meth:`FusedProjection.make_opaque`).

        Where both projections run as opaque calls (packed: every projection of a hidden-1024
        model), the graph makes one opaque call for the whole MLP instead, SiLU·up running eagerly
        inside it: a custom op's dispatch costs more than the fused multiply saves.
        """
        for projection, linears in self.projections():
            projection.make_opaque(linears, sites)
        self._block_op = sites.add(_run_block, self)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_block_op"] = None  # a copy runs eagerly: the registered op calls the original
        return state


def allocate_kv_cache(num_slots: int, num_heads: int, max_model_len: int, head_dim: int, *, like: Tensor) -> Tensor:
    """A zeroed ``[num_slots, num_heads, max_model_len, head_dim]`` cache with ``like``'s dtype and device.

    Head-major: one KV head's keys of one slot are contiguous, so the attention of a run of slots
    streams each head's ``[kv_len, head_dim]`` block once. With positions outermost
    (``[slots, len, heads, d]``) a head's keys sit ``heads * d`` floats apart and every head re-reads
    the slots' whole cache lines; once a run's cache outgrows L2 that read cost 2.7-4.6x more per
    decode call on this CPU (16-64 rows of 300-640 keys; see *Design notes -> CPU serving speed*).
    On a CPU the cache is advised onto transparent huge pages (:func:`huge_page_zeros`), since
    attention streams it every step.
    """
    if like.device.type == "cpu":
        return huge_page_zeros(num_slots, num_heads, max_model_len, head_dim, dtype=like.dtype)
    return torch.zeros(num_slots, num_heads, max_model_len, head_dim, dtype=like.dtype, device=like.device)


def slot_attention(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, batch: SlotBatch, scale: float
) -> Tensor:
    """Write this step's K/V into the slots' caches, then attend causally within each slot.

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` queries (rotary already applied).
        k: ``[num_tokens, num_kv_heads, head_dim]`` keys (rotary already applied).
        v: ``[num_tokens, num_kv_heads, v_head_dim]`` values.
        k_cache: ``[num_slots, num_kv_heads, max_model_len, head_dim]`` (:func:`allocate_kv_cache`).
        v_cache: ``[num_slots, num_kv_heads, max_model_len, v_head_dim]``.
        batch: the step's slot indices, shared by every attention layer of the step.
        scale: softmax scale.

    Returns:
        ``[num_tokens, num_heads, v_head_dim]``.
    """
    gqa = q.shape[1] != k.shape[1]
    # Every token writes exactly its own (slot, position) cell: rows never touch another slot.
    short = batch.short_rows
    if short is not None:
        k_short = k if short.write_tokens is None else k[short.write_tokens]  # [n, kv_heads, d]
        v_short = v if short.write_tokens is None else v[short.write_tokens]  # [n, kv_heads, dv]
        k_cache[short.write_slots, :, short.write_positions] = k_short
        v_cache[short.write_slots, :, short.write_positions] = v_short
    for chunk in batch.long_rows:
        k_cache[chunk.slot, :, chunk.num_computed : chunk.seq_len] = k[chunk.start : chunk.end].transpose(0, 1)
        v_cache[chunk.slot, :, chunk.num_computed : chunk.seq_len] = v[chunk.start : chunk.end].transpose(0, 1)

    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])  # [num_tokens, num_heads, v_head_dim]
    if short is not None:
        attended = _attend_short_rows(q, k_cache, v_cache, short, scale, v.shape[2])  # [R, Q, heads, dv]
        flat = attended.reshape(-1, attended.shape[2], attended.shape[3])  # [R * Q, heads, v_head_dim]
        if not batch.long_rows and short.write_tokens is None and short.valid_src is None:
            return flat  # a decode-only step: the short rows are every token, in flat order
        if short.valid_src is not None:
            out[short.write_tokens] = flat[short.valid_src]
        elif short.write_tokens is None:
            out[: flat.shape[0]] = flat
        else:
            out[short.write_tokens] = flat

    for chunk in batch.long_rows:
        # A prefill chunk: its queries attend to the slot's cache up to each query's own position.
        keys = k_cache[chunk.slot, :, : chunk.seq_len].unsqueeze(0)  # [1, kv_heads, S, d]
        values = v_cache[chunk.slot, :, : chunk.seq_len].unsqueeze(0)  # [1, kv_heads, S, dv]
        queries = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        attended = _attend_prefill_chunk(queries, keys, values, chunk, scale, gqa, k_cache.shape[2])
        out[chunk.start : chunk.end] = attended[0].transpose(0, 1)  # from [1, heads, n, v_head_dim]
    return out


PREFILL_BLOCK = 64
"""Query rows per attention call of a prefill chunk on the CPU. torch's CPU flash kernel limits a
causal query block's keys to the block's end only in whole 512-key blocks, so one causal call over
``n <= 512`` queries computes all ``n * n`` scores and masks half of them; calls of 64 rows, each over
the keys up to its own last position, compute about half. Measured per chunk: 1.24x faster at 200
tokens and 1.37x at 400 on the tiny peer model's shapes (8 heads of 32 over 4 KV heads), 1.36x and
1.46x on the big one's (16 heads of 64 over 8), even at 64 (*Design notes → CPU serving speed*)."""


def _attend_prefill_chunk(
    queries: Tensor, keys: Tensor, values: Tensor, chunk: LongRow, scale: float, gqa: bool, max_len: int
) -> Tensor:
    """``[1, heads, n, dv]``: a prefill chunk's queries (``[1, heads, n, d]``) over its slot's keys
    and values up to its end (``[1, kv_heads, seq_len, d | dv]``), each query up to its own position.

    On the CPU, in calls of :data:`PREFILL_BLOCK` queries, each over the keys up to its last query;
    elsewhere (fused GPU kernels skip masked blocks themselves) in one call.
    """
    n, done = chunk.end - chunk.start, chunk.num_computed
    if done:  # a continuing chunk brings its mask where it is attended in one call (bind: off the CPU)
        one_call = chunk.key_mask is not None
    else:  # a chunk that starts its sequence: one causal call off the CPU, or when it fits one block
        one_call = n <= PREFILL_BLOCK or not queries.is_cpu
    if one_call:
        # SDPA builds the square causal mask itself, or reads the chunk's.
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=chunk.key_mask, is_causal=done == 0, scale=scale, enable_gqa=gqa
        )  # fmt: skip
    out = queries.new_empty(1, queries.shape[1], n, values.shape[3])  # [1, heads, n, dv]
    bias = _block_causal_bias(max_len, queries.dtype, queries.device)  # [PREFILL_BLOCK, width]
    for first in range(0, n, PREFILL_BLOCK):
        last = min(n, first + PREFILL_BLOCK)  # queries [first, last): positions done + first ...
        num_keys = done + last  # the block reads keys [0, num_keys)
        if done == 0 and first == 0:
            mask, causal = None, True  # the chunk's first block starts the sequence: square causal
        else:
            # Key j is readable by block query i iff j <= done + first + i: the slice of the bias
            # whose diagonal sits at column `done + first` (see _block_causal_bias).
            shift = bias.shape[1] - PREFILL_BLOCK - (done + first)
            mask, causal = bias[: last - first, shift : shift + num_keys], False  # [rows, num_keys]
        out[:, :, first:last] = F.scaled_dot_product_attention(
            queries[:, :, first:last], keys[:, :, :num_keys], values[:, :, :num_keys],
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa,
        )  # fmt: skip
    return out


@functools.cache
def _block_causal_bias(max_len: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[PREFILL_BLOCK, max_len + PREFILL_BLOCK]`` additive bias, ``-inf`` where column ``c > max_len + i``
    for row ``i``, else ``0``: the slice ``[:rows, shift : shift + num_keys]`` with ``shift = max_len -
    p`` lets query row ``i`` (position ``p + i``) read keys ``0 .. p + i``. One table per cache length,
    dtype and device, shared by every layer and step (a view per call, nothing built per step)."""
    width = max_len + PREFILL_BLOCK
    # A plain tensor even when first asked for inside a serving step's inference_mode: an inference
    # tensor could not be read by a later forward that records gradients.
    with torch.inference_mode(False):
        row = torch.arange(PREFILL_BLOCK, device=device)[:, None]  # [PREFILL_BLOCK, 1]
        col = torch.arange(width, device=device)[None, :]  # [1, width]
        table = torch.zeros(PREFILL_BLOCK, width, dtype=dtype, device=device)  # [PREFILL_BLOCK, width]
        return table.masked_fill_(col > max_len + row, float("-inf"))


def _attend_short_rows(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, short: ShortRows, scale: float, dv: int
) -> Tensor:
    """``[R, Q, heads, dv]``: all short rows (decode, decode + drafts), one attention call per slot run.

    Each run reads ``cache[slot_lo:slot_hi, :, :kv_len]`` as a view — the caches are never gathered.
    Rows are placed into the runs' span by slot (``span_index``); a hole's zero queries attend to
    finite cache values and their outputs are dropped.

    With grouped KV heads the ``G = heads / kv_heads`` query heads of one KV head are folded into
    the query axis (``[span, kv_heads, G * Q, d]``): every KV head is then read once, as one GEMM
    for its G queries, instead of once per query head (measured 1.2–1.5x faster at decode). Head
    ``h`` reads KV head ``h // G``, as HF's ``repeat_kv`` and SDPA's ``enable_gqa`` do. The queries
    are folded, and the outputs unfolded, once per layer, not once per run: a step has up to ~15
    runs a layer, and each op around a call costs about as much as a short run's keys.
    """
    token_index = short.token_index  # [R, Q]
    num_rows, q_len = token_index.shape
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    # write_tokens is None: the short rows are the whole step in flat order, q needs no gather.
    gathered = q if short.write_tokens is None else q.index_select(0, token_index.view(-1))
    folded = gathered.view(num_rows, q_len, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)  # [R, kv, G, Q, d]
    rows_q = folded.reshape(num_rows, kv_heads, group * q_len, head_dim)  # [R, kv_heads, G * Q, d]
    if short.span_index is None:
        span_q = rows_q  # the rows are the span, in slot order
    else:
        span_q = q.new_zeros(short.span, kv_heads, group * q_len, head_dim)  # [span, kv_heads, G * Q, d]
        span_q[short.span_index] = rows_q
    outs = []  # per run: [n, kv_heads, G * Q, dv], the runs laid out one after another in the span
    for run in short.runs:
        keys = k_cache[run.slot_lo : run.slot_hi, :, : run.kv_len]  # [n, kv_heads, L, d]: a view
        values = v_cache[run.slot_lo : run.slot_hi, :, : run.kv_len]  # [n, kv_heads, L, dv]
        bias = run.key_bias  # [n, 1, Q, L]: with Q = 1 it broadcasts over the folded G queries
        if bias is not None and group > 1 and q_len > 1:
            bias = bias.repeat(1, 1, group, 1)  # [n, 1, G * Q, L]: folded query g * Q + i
        if bias is not None and bias.dtype != q.dtype:
            bias = bias.to(q.dtype)  # the host builds float32 biases: match the queries' dtype
        queries = span_q[run.offset : run.offset + run.slot_hi - run.slot_lo]  # [n, kv_heads, G * Q, d]
        outs.append(F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias, scale=scale))
    span_out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [span, kv_heads, G * Q, dv]
    if short.span_index is not None:
        span_out = span_out[short.span_index]  # [R, kv_heads, G * Q, dv]
    unfolded = span_out.view(num_rows, kv_heads, group, q_len, dv).permute(0, 3, 1, 2, 4)  # [R, Q, kv, G, dv]
    return unfolded.reshape(num_rows, q_len, heads, dv)


class SlotAttention(nn.Module):
    """Multi-head attention with grouped KV heads, rotary positions and a per-slot KV cache."""

    def __init__(
        self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *, bias: bool
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        # Runtime state, not weights (kept out of the state dict): set by allocate_slots.
        self.k_cache: Tensor | None = None  # [num_slots, num_kv_heads, max_model_len, head_dim]
        self.v_cache: Tensor | None = None  # [num_slots, num_kv_heads, max_model_len, head_dim]
        self._qkv = FusedProjection()  # q, k and v in one matmul (weights stay HF-named)
        self._o = FusedProjection()  # o_proj, pre-packed where that pays
        # Inside a compiled graph: the call ids of the opaque ops that attend, and that run the
        # whole block where both projections are opaque calls anyway (see make_opaque).
        self._op: int | None = None
        self._block_op: int | None = None

    def projections(self) -> list[tuple[FusedProjection, tuple[nn.Linear, ...]]]:
        """Each fused projection with the linears it computes."""
        return [(self._qkv, (self.q_proj, self.k_proj, self.v_proj)), (self._o, (self.o_proj,))]

    def prepack_linears(self) -> None:
        for projection, linears in self.projections():
            projection.prepare(linears)

    def make_opaque(self, sites: OpaqueSites) -> None:
        """Make the projections compile, and the slot attention run as one opaque op in a graph.

        The attention op reads the step's ``SlotBatch`` from the step context the model sets
        around its compiled call (:func:`~tokenstate.models.compiled.compiled_step`). Where both
        projections run as opaque calls (packed), the graph makes one opaque call for the whole
        block instead — projections, rotary and attention — so a layer pays one custom op's
        dispatch where it paid three (big peer model, workload A: 1.04x, same tokens).
        """
        for projection, linears in self.projections():
            projection.make_opaque(linears, sites)
        self._op = sites.add(_attend_in_step, self)
        self._block_op = sites.add(_run_attention_block, self)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_op"] = state["_block_op"] = None  # a copy runs eagerly: the registered ops call the original
        return state

    def allocate_slots(self, num_slots: int, max_model_len: int) -> None:
        w = self.k_proj.weight
        self.k_cache = allocate_kv_cache(num_slots, self.num_kv_heads, max_model_len, self.head_dim, like=w)
        self.v_cache = allocate_kv_cache(num_slots, self.num_kv_heads, max_model_len, self.head_dim, like=w)

    def reset_slot(self, slot: int, written: int | None = None) -> None:
        """Zero the slot's caches: cells ``[0, written)`` (all of them when ``written`` is ``None``)."""
        if self.k_cache is not None and self.v_cache is not None:
            self.k_cache[slot, :, :written].zero_()
            self.v_cache[slot, :, :written].zero_()

    def caches(self) -> tuple[Tensor, Tensor]:
        """The ``(k_cache, v_cache)`` of :meth:`allocate_slots`; :class:`ConfigError` before it."""
        if self.k_cache is None or self.v_cache is None:
            raise ConfigError("attention has no KV cache: call model.allocate_slots(num_slots) first.")
        return self.k_cache, self.v_cache

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, batch: SlotBatch | None) -> Tensor:
        n = x.shape[0]
        if self._block_op is not None and torch.compiler.is_compiling():
            if self._qkv.opaque_in_graph() and self._o.opaque_in_graph():
                return opaque_call(self._block_op, (x, cos, sin), (x.shape[1],))  # [num_tokens, hidden]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self._qkv(x, (self.q_proj, self.k_proj, self.v_proj)).view(
            n, heads + 2 * kv_heads, self.head_dim
        )  # [num_tokens, heads + 2 * kv_heads, head_dim]: q heads, then k, then v
        # One rotation for queries and keys together (adjacent in qkv): half the small ops of a step.
        q, k = RotaryEmbedding.rotate(qkv[:, : heads + kv_heads], cos, sin).split((heads, kv_heads), dim=1)
        v = qkv[:, heads + kv_heads :]  # [num_tokens, kv_heads, head_dim]
        if self._op is not None and torch.compiler.is_compiling():
            # The caches stay out of the graph (traced, their slot count would become a guard).
            out = opaque_call(self._op, (q, k, v), (heads, v.shape[2]))  # [num_tokens, heads, head_dim]
        else:  # batch is None only in a compiled model's layers that dynamo chose to run eagerly
            step_batch = batch if batch is not None else current_attention_batch()
            out = slot_attention(q, k, v, *self.caches(), step_batch, self.scale)
        return self._o(out.reshape(n, self.num_heads * self.head_dim), (self.o_proj,))


def _run_attention_block(objects: tuple, inputs: list[Tensor]) -> Tensor:
    """The opaque attention block's body: the layer's attention, eagerly, over the step's ``SlotBatch``."""
    (attention,) = objects
    x, cos, sin = inputs
    return attention(x, cos, sin, current_attention_batch())  # a new tensor: o_proj's output


def _run_block(objects: tuple, inputs: list[Tensor]) -> Tensor:
    """An opaque block's body: the module, eagerly, on the graph's input (a new tensor)."""
    (module,) = objects
    return module(*inputs)


def _attend_in_step(objects: tuple, inputs: list[Tensor]) -> Tensor:
    """The opaque attention op's body: ``slot_attention`` over the step context's ``SlotBatch``."""
    (attention,) = objects
    q, k, v = inputs
    out = slot_attention(q, k, v, *attention.caches(), current_attention_batch(), attention.scale)
    return out.contiguous()  # the graph was compiled for the contiguous [num_tokens, heads, dv] it declares
