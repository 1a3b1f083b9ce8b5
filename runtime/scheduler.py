"""Continuous batching: which requests run this step, with how many tokens each, in which slot.

The scheduler only ever sees tokens the host *knows*. On the async path a request whose previous
row sampled a token on the device carries that token as ``num_inflight``: it counts towards the
request's length (so the next row can feed it, as a placeholder spliced on the device) and towards
``max_tokens``, but it is not in ``output_token_ids`` until the host resolves it one step later. A
request can therefore hit EOS at step N while already scheduled in step N+1; :meth:`Scheduler.update`
discards that extra token.

Row order is decode-first: running requests that finished their prefill (one token each), then
running requests still in (chunked) prefill, then newly admitted requests, each group in admission
order, until ``max_num_seqs`` or the token budget ``max_num_batched_tokens`` is used up.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tokenstate.contracts import ContractViolation
from tokenstate.runtime.outputs import FinishReason, RequestOutput, TokenOrigin
from tokenstate.runtime.params import SamplingParams

__all__ = ["Request", "ScheduledBatch", "ScheduledRow", "Scheduler"]


@dataclass(eq=False, slots=True)
class Request:
    """One request's host-side state for its whole lifetime."""

    request_id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int  # effective sampling seed (the params' seed, or one derived from the engine seed)
    eos_token_id: int | None
    # Resolved tokens only, never a placeholder; origins[i] says where output_token_ids[i] was sampled.
    output_token_ids: list[int] = field(default_factory=list)
    origins: list[TokenOrigin] = field(default_factory=list)
    slot: int = -1
    num_computed: int = 0  # tokens already fed to the model (advanced when a row is scheduled)
    num_inflight: int = 0  # tokens sampled on the device that the host has not resolved yet
    prefill_len: int = 0  # tokens the host knew at admission
    finish_reason: FinishReason | None = None

    @property
    def num_known(self) -> int:
        return len(self.prompt) + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Length including in-flight tokens: the positions a row may feed."""
        return self.num_known + self.num_inflight

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def token_at(self, position: int) -> int:
        """A known token by position (prompt, then resolved outputs)."""
        prompt_len = len(self.prompt)
        return (
            self.prompt[position]
            if position < prompt_len
            else self.output_token_ids[position - prompt_len]
        )

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
    """One batch row: ``num_new_tokens`` positions from ``num_computed`` of ``request``'s slot."""

    request: Request
    num_computed: int
    num_new_tokens: int
    samples: bool  # the row reaches the end of the request's tokens, so its sample is kept

    @property
    def seq_len(self) -> int:
        return self.num_computed + self.num_new_tokens


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


class Scheduler:
    """Continuous batching with a token budget, chunked prefill and per-request slots."""

    def __init__(
        self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self._free_slots = list(range(max_num_seqs))  # a heap: the lowest free slot is reused first

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _wants_row(self, req: Request) -> bool:
        if req.num_computed < req.prefill_len:
            return True  # prefill chunks always run
        # A decode row feeds the newest token and samples the next; only worth it while the request
        # may still grow. Otherwise it waits for its in-flight token to resolve and finish it.
        generated = len(req.output_token_ids) + req.num_inflight
        return (
            req.num_computed < req.num_tokens
            and generated < req.params.max_tokens
            and req.num_tokens < self.max_model_len
        )

    def _row(self, req: Request, budget: int) -> ScheduledRow:
        num_new = min(req.num_tokens - req.num_computed, budget)
        row = ScheduledRow(
            req, req.num_computed, num_new, req.num_computed + num_new == req.num_tokens
        )
        req.num_computed += num_new
        if row.samples:
            req.num_inflight += 1
        return row

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        decode = [r for r in self.running if r.num_computed >= r.prefill_len and self._wants_row(r)]
        prefill = [r for r in self.running if r.num_computed < r.prefill_len]
        rows: list[ScheduledRow] = []
        for req in (*decode, *prefill):
            if budget == 0:
                break
            rows.append(self._row(req, budget))
            budget -= rows[-1].num_new_tokens
        admitted: list[Request] = []
        while self.waiting and budget > 0 and self._free_slots:
            req = self.waiting.popleft()
            req.slot = heapq.heappop(self._free_slots)
            req.prefill_len = req.num_known
            req.num_computed = 0
            self.running.append(req)
            admitted.append(req)
            rows.append(self._row(req, budget))
            budget -= rows[-1].num_new_tokens
        return ScheduledBatch(tuple(rows), tuple(admitted))

    def update(
        self,
        batch: ScheduledBatch,
        sampled: np.ndarray,
        *,
        step: int = 0,
        stale: np.ndarray | None = None,
    ) -> tuple[list[Request], np.ndarray]:
        """Apply one step's resolved tokens (``[num_sampling_rows]``, one per sampling row, in row
        order); ``step`` and ``stale`` (per sampling row: its last input id was spliced on the
        device) are recorded as each kept token's :class:`TokenOrigin`.

        Returns the requests that finished and a ``[num_sampling_rows]`` bool mask of the tokens kept
        (a token sampled for a request that had already finished is discarded).
        """
        tokens = sampled.tolist()
        stale_flags = [False] * len(tokens) if stale is None else stale.tolist()
        kept = np.ones(len(tokens), dtype=bool)  # [num_sampling_rows] bool
        finished: list[Request] = []
        i = 0
        for row_index, row in enumerate(batch.rows):
            if not row.samples:
                continue
            req, token = row.request, tokens[i]
            if req.finished:
                kept[i] = False
            else:
                req.num_inflight -= 1
                req.output_token_ids.append(token)
                req.origins.append(TokenOrigin(step, row_index, stale_flags[i]))
                reason = self._stop_reason(req, token)
                if reason is not None:
                    self.finish(req, reason)
                    finished.append(req)
            i += 1
        if i != len(tokens):
            raise ContractViolation(
                f"Scheduler.update: {len(tokens)} tokens for {i} sampling rows; pass exactly one "
                "resolved token per sampling row of the batch."
            )
        return finished, kept

    def _stop_reason(self, req: Request, token: int) -> FinishReason | None:
        params = req.params
        if (token == req.eos_token_id and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if len(req.output_token_ids) >= params.max_tokens or req.num_known >= self.max_model_len:
            return "length"
        return None

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Mark a request finished and free its slot at once (its in-flight rows are discarded)."""
        req.finish_reason = reason
        self.running.remove(req)
        heapq.heappush(self._free_slots, req.slot)

    def abort_all(self) -> None:
        """Drop every request and free every slot (after an error aborted a generate call)."""
        self.waiting.clear()
        self.running.clear()
        self._free_slots = list(range(self.max_num_seqs))
