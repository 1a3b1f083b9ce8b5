"""A request's host-side state, and the rows and batches the scheduler hands the runner.

The host only ever holds tokens it *knows*. On the async path a row's sampled token stays on the
device until the host resolves the step one step later; until then it is counted in
``num_inflight`` (it lengthens the request, so the next row can feed it as a placeholder spliced on
the device, and it counts towards ``max_tokens``) but it is not in ``output_token_ids``.

A row with speculative drafts emits between 1 and ``1 + num_drafts`` tokens, and how many is only
known once the step resolves; until then the request is ``awaiting_drafts`` and is not scheduled
(its next row's positions depend on the count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenstate.runtime.outputs import FinishReason, RequestOutput, TokenOrigin
from tokenstate.runtime.params import SamplingParams

__all__ = ["Request", "ScheduledBatch", "ScheduledRow"]


@dataclass(eq=False, slots=True)
class Request:
    """One request's host-side state for its whole lifetime."""

    request_id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int  # effective sampling seed (the params' seed, or one derived from the engine seed)
    eos_token_ids: tuple[int, ...]  # the model's stop ids (an HF eos list may hold several)
    # Resolved tokens only, never a placeholder; origins[i] says where output_token_ids[i] was sampled.
    output_token_ids: list[int] = field(default_factory=list)
    origins: list[TokenOrigin] = field(default_factory=list)
    slot: int = -1  # -1 while waiting (never admitted, or preempted)
    num_computed: int = 0  # tokens already fed to the model (advanced when a row is scheduled)
    num_inflight: int = 0  # sampling rows whose tokens the host has not resolved yet
    prefill_len: int = 0  # tokens the host knew at the latest admission
    finish_reason: FinishReason | None = None
    arrival: int = -1  # priority: lower arrived earlier and is preempted last
    admissions: int = 0  # how often the request was admitted to a slot (1 + preemptions survived)
    awaiting_drafts: bool = False  # a row with drafts is in flight: its emitted count is unknown
    num_discarded: int = 0  # resolved tokens that did not join the output (only ever after its finish)
    # The drafts proposed on the device after the request's last resolved sampling row, as the host
    # learnt them at that step's sync point (fed as fresh host ids on the synchronous path).
    host_drafts: tuple[int, ...] = ()

    @property
    def num_known(self) -> int:
        return len(self.prompt) + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Length including in-flight tokens: the positions a row may feed."""
        return self.num_known + self.num_inflight

    @property
    def num_generated(self) -> int:
        """Generated tokens, resolved or in flight."""
        return len(self.output_token_ids) + self.num_inflight

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_output(self) -> RequestOutput:
        assert self.finish_reason is not None
        return RequestOutput(
            self.request_id,
            self.prompt,
            tuple(self.output_token_ids),
            self.finish_reason,
            tuple(self.origins),
        )


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One batch row: ``num_new_tokens`` positions from ``num_computed`` of ``request``'s slot.

    The last ``num_drafts`` of those positions are speculative drafts (proposed on the device); a
    sampling row has ``1 + num_drafts`` logits.
    """

    request: Request
    num_computed: int
    num_new_tokens: int
    samples: bool  # the row reaches the end of the request's tokens, so its sample is kept
    num_drafts: int = 0
    slot: int = -1  # the request's slot when the row was scheduled
    admission: int = 0  # the request's admission count then (a later one means it was preempted)

    @property
    def seq_len(self) -> int:
        return self.num_computed + self.num_new_tokens

    @property
    def num_logits(self) -> int:
        return 1 + self.num_drafts if self.samples else 0


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step's rows (in batch order) and the requests admitted to a slot in this step."""

    rows: tuple[ScheduledRow, ...]
    admitted: tuple[Request, ...]

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.rows)

    @property
    def sampling_rows(self) -> tuple[ScheduledRow, ...]:
        return tuple(r for r in self.rows if r.samples)

    @property
    def num_logits(self) -> int:
        return sum(r.num_logits for r in self.rows)
