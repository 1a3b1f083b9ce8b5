"""What :meth:`LLM.generate` returns, and the engine's step counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CompletionOutput", "EngineStats", "FinishReason", "RequestOutput", "TokenOrigin"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class TokenOrigin:
    """Where one output token was sampled: for tracing a divergence to its step and row.

    Attributes:
        step: the engine step (counted from 0 over the engine's lifetime) that sampled it.
        row: the request's batch row in that step.
        stale: whether that row's last input id was spliced in on the device (the host held a
            placeholder there) rather than read from fresh host ids.
    """

    step: int
    row: int
    stale: bool


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One completion of a request, in vLLM's shape (``output.outputs[0].token_ids``).

    Attributes:
        index: the completion's index within its request (always ``0``: one completion per prompt).
        token_ids: the generated tokens, as in :attr:`RequestOutput.token_ids`.
        finish_reason: as in :attr:`RequestOutput.finish_reason`.
    """

    index: int
    token_ids: tuple[int, ...]
    finish_reason: FinishReason


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One finished request.

    Attributes:
        request_id: index of the prompt in the ``generate`` call.
        prompt_token_ids: the prompt as given.
        token_ids: generated tokens; a stop token (EOS or a ``stop_token_ids`` entry) is kept.
        finish_reason: ``"stop"`` (EOS or a stop token) or ``"length"`` (``max_tokens`` or the
            model's context is full).
        origins: one :class:`TokenOrigin` per generated token (diagnostics: not compared by
            ``==``, since sync and async runs of the same request sample in different steps).

    Code written for vLLM reads the same tokens through :attr:`outputs`:
    ``output.outputs[0].token_ids == output.token_ids``.
    """

    request_id: int
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    origins: tuple[TokenOrigin, ...] = field(default=(), compare=False)

    @property
    def outputs(self) -> tuple[CompletionOutput]:
        """vLLM's view: the request's completions (exactly one)."""
        return (CompletionOutput(0, self.token_ids, self.finish_reason),)


@dataclass(slots=True)
class EngineStats:
    """Counters over an engine's lifetime.

    Attributes:
        async_steps: steps run on the asynchronous device path (the host learned their sampled
            tokens one step late).
        fallback_steps: steps of an async engine that had spliced rows but whose forward did not
            opt in, so they ran the synchronous host path with fresh host tokens.
        sync_steps: steps of a synchronous engine.
        discarded_tokens: tokens sampled for a request that had already finished (async only:
            the request was scheduled again before the host learned that it was done).
        finished_requests: requests returned to callers.
        preemptions: running requests that gave up their slot because the KV budget ran out (they
            re-prefill everything the host knows when re-admitted).
        reordered_steps: steps whose rows the ``"random"`` scheduling order permuted.
        skipped_rows: times a running request that wanted a row was left out of a step by the
            token budget (it rejoins a later step).
        skipped_prefill_rows: ... of those, rows of a request still prefilling (its next chunk waits).
        drafts_proposed: speculative draft tokens scheduled for verification.
        drafts_accepted: drafts the target model confirmed (each one emitted a token for free).
        drafts_rejected: drafts it refused (their positions are recomputed later).
        slot_reuses: admissions to a slot that an earlier request (or an earlier admission of the
            same request) had held: the slot's per-request state had to be reseeded.
        preempted_in_flight: preemptions of a request with a token (or drafts) still in flight.
        preempted_awaiting_drafts: ... of those, preemptions while its drafts were being verified.
        slots_handed_over_in_flight: admissions to a slot whose previous owner was preempted (or
            released, below) and still had a token in flight: that token resolves after the slot
            has a new owner.
        readmissions_held_in_flight: times a preempted request that would fit again waited one
            more step because its token was still in flight (it must re-prefill that token too).
        slots_released_in_flight: running requests whose in-flight tokens were certain to finish
            them (a length limit) and whose slot went to a waiting request before those tokens
            resolved (async only; the sync path frees the slot in the same step).
    """

    async_steps: int = 0
    fallback_steps: int = 0
    sync_steps: int = 0
    discarded_tokens: int = 0
    finished_requests: int = 0
    preemptions: int = 0
    reordered_steps: int = 0
    skipped_rows: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    drafts_rejected: int = 0
    slot_reuses: int = 0
    preempted_in_flight: int = 0
    preempted_awaiting_drafts: int = 0
    slots_handed_over_in_flight: int = 0
    skipped_prefill_rows: int = 0
    readmissions_held_in_flight: int = 0
    slots_released_in_flight: int = 0

    @property
    def total_steps(self) -> int:
        """Every step the engine ran: ``async_steps + fallback_steps + sync_steps``."""
        return self.async_steps + self.fallback_steps + self.sync_steps

    def as_dict(self) -> dict[str, int]:
        """Every counter plus ``total_steps``, for reports."""
        return {**dataclasses.asdict(self), "total_steps": self.total_steps}
