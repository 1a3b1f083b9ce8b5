"""The device mirror: per-slot token state on the execution device, and the step's transfers.

The mirror holds what the async path needs on the device — each slot's ``last_sampled`` token,
``prefill_len``, ``num_computed``, draft table and token history, plus its sampling parameters and
penalties — and moves the per-step host inputs up and each step's results (sampled tokens, emitted
counts, next drafts) down. Everything is indexed by slot and reseeded when a request is admitted.

Nothing here touches a device tensor from the host thread: the host *stages* (writes a host
buffer, waits on a fence) and *submits* (the copy, the reseed) to the mirror's
:class:`~tokenstate.runtime.stream.DeviceStream`. The same double-buffered staging and the same
events run on CUDA (pinned buffers, non-blocking copies, ``torch.cuda.Event``) and on the CPU (a
worker thread, real events), so the host learns a step's tokens only when it resolves them — one
step late on the async path — and a missing fence fails on the CPU as it would on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tokenstate.contracts import PLACEHOLDER, BatchLayout, IndexPlan
from tokenstate.runtime.input_prep import HostStepInputs
from tokenstate.runtime.kernels.guard import StepGuard
from tokenstate.runtime.scheduler import Request
from tokenstate.runtime.stream import DeviceStream, StreamEvent

__all__ = ["DeviceMirror", "DeviceStepInputs", "PendingTokens", "StagedStep"]

# Seeds are hashed in 31-bit halves on the device (see the sampler), so keep them in 62 bits.
_SEED_MASK = (1 << 62) - 1


@dataclass(frozen=True, slots=True)
class DeviceStepInputs:
    """One step's uploaded inputs (views into the mirror's device staging buffer)."""

    host_ids: torch.Tensor | None  # [num_tokens] int32 (PLACEHOLDER where stale); None: not uploaded
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
    # Where this step's drafts sit in the history, and where in ``draft_tokens`` each one is:
    draft_history_index: torch.Tensor  # [num_draft_logits] int64, into history.view(-1)
    draft_source: torch.Tensor  # [num_draft_logits] int64, into draft_tokens.view(-1)
    model_indices: tuple[torch.Tensor, ...]  # the model's IndexPlan arrays, int64 each


@dataclass(frozen=True, slots=True)
class StagedStep:
    """One step's inputs as the host staged them, before the stream copies them in.

    Two host buffers (int32, int64) hold the step's parts one after another; the step's device
    work starts with :meth:`copy_in`, which copies them into the device buffers and splits those
    into the step's :class:`DeviceStepInputs`. The copy is the step's own first act, not a task of
    its own, so a step is handed over as one task behind one event (on a device process each task
    costs an unpickling and each event an answer), and a device process receives two buffer views
    and these sizes, not one view per field.
    """

    ints: torch.Tensor  # [sum(int_sizes)] int32, device: where the int32 parts land
    longs: torch.Tensor  # [sum(long_sizes)] int64, device: where the int64 parts land
    host_ints: torch.Tensor  # [sum(int_sizes)] int32, the host staging buffer's prefix
    host_longs: torch.Tensor  # [sum(long_sizes)] int64
    int_sizes: tuple[int, ...]  # (host ids,) query_start_loc, seq_lens, slots, num_drafts, cu_num_logits
    long_sizes: tuple[int, ...]  # the nine int64 fields of DeviceStepInputs, then the model's arrays
    host_ids: bool  # the host ids were staged (the step runs combine)
    turns: tuple[int, int]  # which of each staging's two host buffers holds the step (host only)

    def copy_in(self) -> DeviceStepInputs:
        """On the stream: copy the staged host buffers into the device buffers; the step's inputs,
        views of those. On CUDA the host buffers are pinned and the copies do not block the host."""
        non_blocking = self.ints.is_cuda
        self.ints.copy_(self.host_ints, non_blocking=non_blocking)
        self.longs.copy_(self.host_longs, non_blocking=non_blocking)
        ints = self.ints.split_with_sizes(self.int_sizes)
        qsl, seq_lens, slots, num_drafts, cu_logits = ints[1:] if self.host_ids else ints
        (positions, slots_long, logits_idx, sample_slots, out_idx, sample_pos, history_index,
         draft_history_index, draft_source, *model_indices) = self.longs.split_with_sizes(self.long_sizes)  # fmt: skip
        return DeviceStepInputs(
            host_ids=ints[0] if self.host_ids else None,
            positions=positions,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            slots=slots,
            slots_long=slots_long,
            num_drafts=num_drafts,
            cu_num_logits=cu_logits,
            logits_indices=logits_idx,
            sample_slots=sample_slots,
            sample_output_index=out_idx,
            sample_positions=sample_pos,
            history_index=history_index,
            draft_history_index=draft_history_index,
            draft_source=draft_source,
            model_indices=tuple(model_indices),
        )


class _Staging:
    """Double-buffered host staging for one dtype, and the device buffer its copies land in.

    The host writes buffer ``t`` while the stream may still be copying out of buffer ``1 - t``; before
    buffer ``t`` is rewritten, the host waits on the event recorded behind *its* last copy (the
    staging-reuse fence): the event of the step whose device work copied it. On CUDA the host
    buffers are pinned and the copy is non-blocking; on the CPU streams the copy runs where the
    step's device work runs — the same order, the same fence.
    """

    def __init__(self, stream: DeviceStream, capacity: int, dtype: torch.dtype) -> None:
        self.stream = stream
        self.dtype = dtype
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        # Fresh tensors, never resized in place: a copy still in flight keeps the old ones alive.
        # The stream allocates them: pinned host buffers on CUDA, shared ones for a device process.
        self.capacity = capacity
        self.host = [self.stream.host_buffer(capacity, self.dtype) for _ in range(2)]  # 2 x [capacity]
        self.fences: list[StreamEvent | None] = [None, None]
        self.device_buf = self.stream.device_buffer(self, "device_buf", capacity, self.dtype)  # [capacity]
        self._turn = 0

    def _writable(self) -> int:
        """The host buffer that may be rewritten now: the one whose last copy has finished."""
        turn, self._turn = self._turn, 1 - self._turn
        fence = self.fences[turn]
        if fence is not None:
            fence.wait()  # its copy (two uploads ago) must have left the buffer
        return turn

    def stage(
        self, parts: Sequence[np.ndarray]
    ) -> tuple[int, torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """Write ``parts`` into the host buffer that may be rewritten now (after its fence).

        Returns ``(turn, device prefix, host prefix, part sizes)``: the caller submits the copy
        of the host prefix into the device prefix and hands the event behind it to :meth:`fenced`;
        the device prefix, split by the sizes, holds the parts in stream order.
        """
        sizes = tuple([p.shape[0] for p in parts])
        total = sum(sizes)
        if total > self.capacity:
            self._alloc(max(total, 2 * self.capacity))
        turn = self._writable()
        host = self.host[turn][:total]
        np.concatenate(parts, out=host.numpy(), casting="same_kind")
        dev = self.device_buf[:total]  # only the stream writes it, in order: one buffer suffices
        return turn, dev, host, sizes

    def fenced(self, turn: int, event: StreamEvent) -> None:
        """``event`` follows the copy out of host buffer ``turn``: rewrite it only after the event."""
        self.fences[turn] = event


class PendingTokens:
    """A step's results on their way to the host; :meth:`resolve` is the step's sync point.

    The stream copies the results into ``host`` and then passes ``event``; the host reads ``host``
    only after waiting on the event (the pending-token fence).
    """

    __slots__ = ("_event", "_guard", "_host", "_layout")

    def __init__(
        self,
        host: torch.Tensor,
        event: StreamEvent,
        guard: StepGuard,
        layout: BatchLayout | None,
    ) -> None:
        self._host = host  # [n] int32, written by the stream before ``event``
        self._event = event
        self._guard = guard
        self._layout = layout

    def resolve(self) -> np.ndarray:
        """Wait for the copy, raise any contract violation recorded in the step, return the tokens."""
        self._event.synchronize()
        self._guard.raise_if_violated(self._layout)
        return self._host.numpy()  # [n] int32


class DeviceMirror:
    """Per-slot state on the execution device (indexed by slot, never by batch row)."""

    def __init__(
        self,
        num_slots: int,
        stream: DeviceStream,
        *,
        max_model_len: int,
        max_drafts: int = 0,
        capacity: int = 1024,
    ) -> None:
        device = stream.device
        self.stream = stream
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
        # sampled tokens — written on the device right after sampling (and a step's drafts just
        # before its logits are processed, overwritten by that write). The one history the
        # penalties, bad words and the draft proposer read: it never holds a placeholder.
        self.history = torch.zeros((num_slots, max_model_len), **i32)  # [num_slots, max_model_len]
        # int32 inputs (the kernels' operands) and int64 ones (torch index operands) are staged
        # apart, so that no upload is followed by per-tensor dtype conversions on the device.
        self._staging = _Staging(stream, capacity, torch.int32)
        self._staging_long = _Staging(stream, capacity, torch.int64)
        # Per step: the sampled tokens (1 + drafts per row), the emitted count per row, the next drafts.
        most = num_slots * (2 + 2 * max_drafts)
        self._sampled_host = [
            stream.host_buffer(most, torch.int32) for _ in range(2)
        ]  # 2 x [most] int32: at most two steps' results are in flight
        self._sampled_turn = 0

    def device_objects(self) -> tuple[object, ...]:
        """The objects holding the mirror's device state (for a stream whose device is a process)."""
        return (self, self._staging, self._staging_long)

    def admit(self, requests: Sequence[Request]) -> None:
        """(Re)seed the slots of newly admitted requests, in one upload per kind of value.

        The token history of each slot gets every token the host knows about the request (its
        prompt and, for a request resumed after preemption, its resolved output). The values are
        packed on the host now; the writes are submitted to the stream, so they land *after* the
        in-flight step that may still write the slot's previous occupant's token (history write
        order).
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
        self.stream.submit(
            self._reseed, slots, ints, floats, seeds, history_index, history_tokens
        )

    def _reseed(
        self, slots: torch.Tensor, ints: torch.Tensor, floats: torch.Tensor, seeds: torch.Tensor,
        history_index: torch.Tensor, history_tokens: torch.Tensor,
    ) -> None:  # fmt: skip
        """On the stream: write the packed admission values into the slot-indexed state."""
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

    def stage(self, step: HostStepInputs, plan: IndexPlan | None = None, *, host_ids: bool = True) -> StagedStep:
        """Stage one step's host inputs in two buffers (int32, int64) for its device work to copy in.

        The int64 buffer also carries the model's index arrays (``plan``), so no forward uploads row
        metadata of its own; ``host_ids=False`` (a step that does not run combine) leaves the host
        ids out: the forward reads them through ``HostTokens``, so an upload would be unused. The
        step's device work starts with :meth:`StagedStep.copy_in`; hand the event recorded behind
        it to :meth:`fence`.
        """
        ids_part = (step.host_tokens.placeholder_buffer().numpy(),) if host_ids else ()
        turn, dev, host, int_sizes = self._staging.stage((
            *ids_part, step.query_start_loc, step.seq_lens, step.slots, step.num_drafts,
            step.cu_num_logits,
        ))  # fmt: skip
        sample_slots = step.sample_slots.astype(np.int64)  # [num_logits]
        sample_positions = step.sample_positions.astype(np.int64)  # [num_logits]
        history_index = sample_slots * self.max_model_len + sample_positions  # [num_logits] int64
        draft_source = sample_slots[step.draft_logits] * self.draft_tokens.shape[1] + step.draft_rank  # [num_draft_logits]
        model_arrays = () if plan is None else plan.arrays
        turn_long, dev_long, host_long, long_sizes = self._staging_long.stage((
            step.positions, step.slots, step.logits_indices, sample_slots, step.sample_output_index,
            sample_positions, history_index, history_index[step.draft_logits], draft_source, *model_arrays,
        ))  # fmt: skip
        return StagedStep(dev, dev_long, host, host_long, int_sizes, long_sizes, host_ids, (turn, turn_long))

    def fence(self, staged: StagedStep, event: StreamEvent) -> None:
        """``event`` was recorded behind the device work that copies ``staged`` in: the host
        buffers it used are rewritten only once it has passed."""
        self._staging.fenced(staged.turns[0], event)
        self._staging_long.fenced(staged.turns[1], event)

    def results_buffer(self, size: int) -> torch.Tensor:
        """The host buffer a step's ``size`` packed results are copied into (``[size]`` int32).

        Two alternate: the host resolves step N before the stream can reach step N+2's copy, which
        is the only one that rewrites step N's buffer.
        """
        if size > self._sampled_host[0].shape[0]:
            self._sampled_host = [self.stream.host_buffer(2 * size, torch.int32) for _ in range(2)]
        buffer = self._sampled_host[self._sampled_turn]
        self._sampled_turn = 1 - self._sampled_turn
        return buffer[:size]

    def copy_results(self, host: torch.Tensor, results: torch.Tensor) -> None:
        """On the stream: start the device→host copy of a step's packed results."""
        host.copy_(results, non_blocking=self.device.type == "cuda")
