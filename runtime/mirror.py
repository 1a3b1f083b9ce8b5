"""The device mirror: per-slot token state on the execution device, and the step's transfers.

The mirror holds what the async path needs on the device — each slot's ``last_sampled`` token,
``prefill_len``, ``num_computed``, draft table and token history, plus its sampling parameters and
penalties — and moves the per-step host inputs up and each step's results (sampled tokens, emitted
counts, next drafts) down. Everything is indexed by slot and reseeded when a request is admitted.

On CUDA the uploads go through pinned staging buffers with non-blocking copies, and the sampled
tokens come back through a pinned buffer whose copy is fenced by an event: the host only waits at
:meth:`PendingTokens.resolve`, the one explicit sync point. On the CPU the same data flow runs with
separate CPU tensors (staging buffer → device buffer copies, a deferred clone of the sampled
tokens), so the host still learns a step's tokens only when it resolves them — one step late on the
async path, exactly as on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tokenstate.contracts import PLACEHOLDER, BatchLayout
from tokenstate.runtime.input_prep import HostStepInputs
from tokenstate.runtime.kernels.guard import StepGuard
from tokenstate.runtime.scheduler import Request

__all__ = ["DeviceMirror", "DeviceStepInputs", "PendingTokens"]

# Seeds are hashed in 31-bit halves on the device (see the sampler), so keep them in 62 bits.
_SEED_MASK = (1 << 62) - 1


@dataclass(frozen=True, slots=True)
class DeviceStepInputs:
    """One step's uploaded inputs (views into the mirror's device staging buffer)."""

    host_ids: torch.Tensor  # [num_tokens] int32 (PLACEHOLDER at stale positions)
    positions: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_rows + 1] int32
    seq_lens: torch.Tensor  # [num_rows] int32
    slots: torch.Tensor  # [num_rows] int32
    slots_long: torch.Tensor  # [num_rows] int64
    num_drafts: torch.Tensor  # [num_rows] int32
    cu_num_logits: torch.Tensor  # [num_rows + 1] int32
    logits_indices: torch.Tensor  # [num_logits] int64
    sample_slots: torch.Tensor  # [num_logits] int64
    sample_output_index: torch.Tensor  # [num_logits] int64
    sample_positions: torch.Tensor  # [num_logits] int64, position each sampled token occupies
    history_index: torch.Tensor  # [num_logits] int64, flat index of that position in the history


class _Staging:
    """A host buffer and its device twin; on CUDA two pinned buffers alternate, each fenced."""

    def __init__(self, device: torch.device, capacity: int, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self._pinned = device.type == "cuda"
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self.host = [
            torch.empty(capacity, dtype=self.dtype, pin_memory=self._pinned) for _ in range(2)
        ]  # 2 x [capacity] of dtype
        self.fences: list[torch.cuda.Event | None] = [None, None]
        self.device_buf = torch.empty(capacity, dtype=self.dtype, device=self.device)  # [capacity]
        self._turn = 0

    def upload(self, parts: Sequence[np.ndarray]) -> list[torch.Tensor]:
        sizes = [p.shape[0] for p in parts]
        total = sum(sizes)
        if total > self.capacity:
            self._alloc(max(total, 2 * self.capacity))
        turn, self._turn = self._turn, 1 - self._turn
        fence = self.fences[turn]
        if fence is not None:
            fence.synchronize()  # the copy two steps ago must be done before its buffer is rewritten
        host = self.host[turn]
        np.concatenate(parts, out=host.numpy()[:total], casting="same_kind")
        dev = self.device_buf[:total]
        dev.copy_(host[:total], non_blocking=self._pinned)
        if self._pinned:
            event = torch.cuda.Event()
            event.record()
            self.fences[turn] = event
        return list(torch.split(dev, sizes))


class PendingTokens:
    """A step's sampled tokens on their way to the host; :meth:`resolve` is the step's sync point."""

    __slots__ = ("_event", "_guard", "_host", "_layout")

    def __init__(
        self,
        sampled: torch.Tensor,
        guard: StepGuard,
        layout: BatchLayout | None,
        host_buffer: torch.Tensor | None,
    ) -> None:
        if sampled.device.type == "cuda":
            assert host_buffer is not None
            self._host = host_buffer[: sampled.shape[0]]  # [num_logits] int32, pinned
            self._host.copy_(sampled, non_blocking=True)
            self._event: torch.cuda.Event | None = torch.cuda.Event()
            self._event.record()
        else:
            # The CPU "copy": a snapshot the host does not look at until resolve(), so the host
            # learns the tokens exactly when it would on a GPU.
            self._host = sampled.clone()
            self._event = None
        self._guard = guard
        self._layout = layout

    def resolve(self) -> np.ndarray:
        """Wait for the copy, raise any contract violation recorded in the step, return the tokens."""
        if self._event is not None:
            self._event.synchronize()
        self._guard.raise_if_violated(self._layout)
        return self._host.numpy()  # [num_logits] int32


class DeviceMirror:
    """Per-slot state on the execution device (indexed by slot, never by batch row)."""

    def __init__(
        self,
        num_slots: int,
        device: torch.device,
        *,
        max_model_len: int,
        max_drafts: int = 0,
        capacity: int = 1024,
    ) -> None:
        self.device = device
        self.max_model_len = max_model_len
        i32 = {"dtype": torch.int32, "device": device}
        f32 = {"dtype": torch.float32, "device": device}
        self.last_sampled = torch.full((num_slots,), PLACEHOLDER, **i32)  # [num_slots] int32
        self.prefill_len = torch.zeros(num_slots, **i32)  # [num_slots] int32
        self.num_computed = torch.zeros(num_slots, **i32)  # [num_slots] int32
        self.draft_tokens = torch.zeros(
            (num_slots, max_drafts), **i32
        )  # [num_slots, max_drafts] int32
        self.temperature = torch.zeros(num_slots, dtype=torch.float32, device=device)  # [num_slots]
        self.top_k = torch.zeros(num_slots, **i32)  # [num_slots] int32, 0 = off
        self.top_p = torch.ones(num_slots, dtype=torch.float32, device=device)  # [num_slots]
        self.seed = torch.zeros(num_slots, dtype=torch.int64, device=device)  # [num_slots] int64
        self.repetition_penalty = torch.ones(num_slots, **f32)  # [num_slots] float32, 1 = off
        self.presence_penalty = torch.zeros(num_slots, **f32)  # [num_slots] float32
        self.frequency_penalty = torch.zeros(num_slots, **f32)  # [num_slots] float32
        # Every token of each slot's request by position — prompt, resolved and still-unresolved
        # sampled tokens — written on the device right after sampling. The one history the
        # penalties, bad words and the draft proposer read: it never holds a placeholder.
        self.history = torch.zeros((num_slots, max_model_len), **i32)  # [num_slots, max_model_len]
        # int32 inputs (the kernels' operands) and int64 ones (torch index operands) are staged
        # apart, so that no upload is followed by per-tensor dtype conversions on the device.
        self._staging = _Staging(device, capacity, torch.int32)
        self._staging_long = _Staging(device, capacity, torch.int64)
        # Per step: the sampled tokens (1 + drafts per row), the emitted count per row, the next drafts.
        most = num_slots * (2 + 2 * max_drafts)
        self._sampled_host = [
            torch.empty(most, dtype=torch.int32, pin_memory=device.type == "cuda") for _ in range(2)
        ]  # 2 x [most] int32: at most two steps' results are in flight
        self._sampled_turn = 0

    def admit(self, requests: Sequence[Request]) -> None:
        """(Re)seed the slots of newly admitted requests, in one upload per kind of value.

        The token history of each slot gets every token the host knows about the request (its
        prompt and, for a request resumed after preemption, its resolved output).
        """
        if not requests:
            return
        slots = torch.tensor([r.slot for r in requests], dtype=torch.int64)  # [n]
        ints = torch.tensor(
            [(r.prefill_len, 0, r.params.top_k, PLACEHOLDER) for r in requests], dtype=torch.int32
        )  # [n, 4]
        floats = torch.tensor(
            [
                (r.params.temperature, r.params.top_p, r.params.repetition_penalty,
                 r.params.presence_penalty, r.params.frequency_penalty)
                for r in requests
            ],
            dtype=torch.float32,
        )  # [n, 5]  # fmt: skip
        seeds = torch.tensor([r.seed & _SEED_MASK for r in requests], dtype=torch.int64)  # [n]
        known = [(*r.prompt, *r.output_token_ids) for r in requests]
        history_index = torch.from_numpy(
            np.concatenate([r.slot * self.max_model_len + np.arange(len(k)) for r, k in zip(requests, known, strict=True)])
        )  # [total_known] int64  # fmt: skip
        history_tokens = torch.tensor([t for k in known for t in k], dtype=torch.int32)
        slots, ints, floats, seeds, history_index, history_tokens = (
            self._to_device(t) for t in (slots, ints, floats, seeds, history_index, history_tokens)
        )
        self.prefill_len.index_copy_(0, slots, ints[:, 0])
        self.num_computed.index_copy_(0, slots, ints[:, 1])
        self.top_k.index_copy_(0, slots, ints[:, 2])
        self.last_sampled.index_copy_(0, slots, ints[:, 3])
        self.temperature.index_copy_(0, slots, floats[:, 0])
        self.top_p.index_copy_(0, slots, floats[:, 1])
        self.repetition_penalty.index_copy_(0, slots, floats[:, 2])
        self.presence_penalty.index_copy_(0, slots, floats[:, 3])
        self.frequency_penalty.index_copy_(0, slots, floats[:, 4])
        self.seed.index_copy_(0, slots, seeds)
        self.history.view(-1).index_copy_(0, history_index, history_tokens)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            # From pinned memory a copy is truly asynchronous; from pageable memory it would wait.
            return t.pin_memory().to(self.device, non_blocking=True)
        return t  # fresh temporaries: on the CPU mirror they already are the device copy

    def upload(self, step: HostStepInputs) -> DeviceStepInputs:
        """Move one step's host inputs to the device in two copies (int32, int64)."""
        host_ids, qsl, seq_lens, slots, num_drafts, cu_logits = self._staging.upload((
            step.host_tokens.placeholder_buffer().numpy(), step.query_start_loc, step.seq_lens,
            step.slots, step.num_drafts, step.cu_num_logits,
        ))  # fmt: skip
        sample_slots = step.sample_slots.astype(np.int64)  # [num_logits]
        sample_positions = step.sample_positions.astype(np.int64)  # [num_logits]
        history_index = sample_slots * self.max_model_len + sample_positions  # [num_logits] int64
        (positions, slots_long, logits_idx, sample_slots_t, out_idx, sample_pos,
         history_index_t) = self._staging_long.upload((
            step.positions, step.slots, step.logits_indices, sample_slots, step.sample_output_index,
            sample_positions, history_index,
        ))  # fmt: skip
        return DeviceStepInputs(
            host_ids=host_ids,
            positions=positions,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            slots=slots,
            slots_long=slots_long,
            num_drafts=num_drafts,
            cu_num_logits=cu_logits,
            logits_indices=logits_idx,
            sample_slots=sample_slots_t,
            sample_output_index=out_idx,
            sample_positions=sample_pos,
            history_index=history_index_t,
        )

    def start_copy(
        self, sampled: torch.Tensor, guard: StepGuard, layout: BatchLayout | None
    ) -> PendingTokens:
        """Begin the device→host copy of a step's results (``[n]`` int32, packed by the runner)."""
        buffer = self._sampled_host[self._sampled_turn]
        self._sampled_turn = 1 - self._sampled_turn
        return PendingTokens(sampled, guard, layout, buffer)
