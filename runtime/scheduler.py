"""Continuous batching: which requests run this step, with how many tokens each, in which slot.

Selection is decode-first: running requests that finished their prefill (one token each, plus
speculative drafts), then running requests still in (chunked) prefill, each group by priority
(arrival order), then waiting requests, until ``max_num_seqs`` slots or the token budget
``max_num_batched_tokens`` is used up; the decode rows then stand in slot order in the batch, so
that the attention reads consecutive slots in place. A running request the budget leaves out is
*skipped* and rejoins a later step where it left off. With ``order="random"`` (seeded) the running requests are
considered in a random order instead — so a prefill chunk may take the budget a decode wanted, and
that decode is skipped — and the selected rows are permuted: every per-request state is
slot-indexed, so row order must never matter. Preemption stays by priority in either order.

**KV budget and preemption.** With ``kv_cache_tokens=N`` the running requests may hold at most ``N``
tokens of KV/state in total (a request holds ``num_computed``). A row that does not fit preempts the
lowest-priority (latest-arrived) running request not yet scheduled in this step, repeatedly; when
none is left, the request preempts itself. A preempted request frees its slot and goes back to the
waiting queue by priority; it is re-admitted (possibly to another slot) only once the host has
resolved all of its in-flight tokens, with ``prefill_len`` = every token the host knows, and
re-prefills them all (recompute — recurrent state is rebuilt the same way).

A request can hit EOS at step N while already scheduled in step N+1 (async): :meth:`Scheduler.update`
discards tokens of a finished request, so no such row ever emits one.

**A slot freed a step early (async).** A running request whose in-flight tokens take it to
``max_tokens`` or ``max_model_len`` will finish whatever they are, and no further row of it can
run; while requests wait, its slot goes to one of them in the step being scheduled, not one step
later when the host learns the token (the sync path frees it in that same step). The request is
*released*: out of ``running``, its late token joins its output when it resolves (never recorded
into the slot's host table, which has a new owner — as for a request preempted in flight); on the
device the new owner's reseed is ordered behind the in-flight step like any slot reuse.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from tokenstate.contracts import ContractViolation
from tokenstate.runtime.outputs import EngineStats, FinishReason, TokenOrigin
from tokenstate.runtime.request import Request, ScheduledBatch, ScheduledRow

__all__ = [
    "SCHEDULING_ORDERS",
    "Request",
    "ScheduledBatch",
    "ScheduledRow",
    "Scheduler",
    "SchedulingOrder",
    "StepUpdate",
]

SchedulingOrder = Literal["decode_first", "random"]
SCHEDULING_ORDERS: tuple[str, ...] = ("decode_first", "random")


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """What :meth:`Scheduler.update` did with one step's resolved tokens (``[num_logits]`` each)."""

    finished: list[Request]
    kept: np.ndarray  # [num_logits] bool: the token was appended to its request's output
    record: np.ndarray  # [num_logits] bool: kept, and the request still holds the row's slot


class Scheduler:
    """Continuous batching with a token budget, chunked prefill, slots, preemption and drafts."""

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        kv_cache_tokens: int | None = None,
        order: SchedulingOrder = "decode_first",
        seed: int = 0,
        num_speculative_tokens: int = 0,
        stats: EngineStats | None = None,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv_cache_tokens = kv_cache_tokens
        self.order = order
        self.num_speculative_tokens = num_speculative_tokens
        self.stats = stats if stats is not None else EngineStats()
        self._rng = np.random.default_rng(seed)
        self.waiting: list[Request] = []  # by arrival (priority)
        self.running: list[Request] = []  # by arrival (priority)
        self._free_slots = list(range(max_num_seqs))  # a heap: the lowest free slot is reused first
        self._num_arrivals = 0
        self._used_slots: set[int] = set()  # slots some admission has held (for slot_reuses)
        self._lost_in_flight: dict[int, Request] = {}  # slot -> request preempted/released with tokens in flight
        self._released: list[Request] = []  # finishing with their last tokens in flight, slot given up

    def add(self, request: Request) -> None:
        request.arrival = self._num_arrivals
        self._num_arrivals += 1
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._released)

    @property
    def unfinished(self) -> tuple[Request, ...]:
        """Every request not finished yet: running, waiting, and released with a token in flight."""
        return (*self.running, *self.waiting, *self._released)

    def _at_length_limit(self, req: Request) -> bool:
        """Whether ``req``'s tokens, in-flight ones counted once per row, reach ``max_tokens`` or
        ``max_model_len``: each in-flight row emits at least one token, so it will finish then."""
        return req.num_generated >= req.params.max_tokens or req.num_tokens >= self.max_model_len

    def _wants_row(self, req: Request) -> bool:
        if req.num_computed < req.prefill_len:
            return True  # prefill chunks always run
        # A decode row feeds the newest token and samples the next; only worth it while the request
        # may still grow. Otherwise it waits for its in-flight token to resolve and finish it.
        return (
            not req.awaiting_drafts
            and req.num_computed < req.num_tokens
            and not self._at_length_limit(req)
        )

    def _release_finishing(self) -> None:
        """Give waiting requests the slots of running ones that can only finish (async): their
        in-flight rows reach a length limit whatever they sample."""
        wanted = len(self.waiting) - len(self._free_slots)
        if wanted <= 0:
            return
        # The in-flight count first: this runs on every step while requests wait.
        finishing = [r for r in self.running if r.num_inflight and self._at_length_limit(r)]
        for req in finishing[:wanted]:
            self.running.remove(req)
            heapq.heappush(self._free_slots, req.slot)
            self._lost_in_flight[req.slot] = req  # its token resolves after the slot's next owner came
            req.slot = -1
            self._released.append(req)
            self.stats.slots_released_in_flight += 1

    def _kv_free(self) -> int:
        assert self.kv_cache_tokens is not None
        # A released request's KV stays counted until its last token resolves (vLLM frees a
        # finished request's blocks when the host learns that it finished, not before).
        held = sum(r.num_computed for r in self.running) + sum(r.num_computed for r in self._released)
        return self.kv_cache_tokens - held

    def _reserve(self, req: Request, need: int, scheduled: set[int]) -> bool:
        """Make room for ``need`` more KV tokens of ``req``; False if ``req`` had to yield its slot."""
        if self.kv_cache_tokens is None:
            return True
        while self._kv_free() < need:
            victims = [
                r for r in self.running if r.arrival > req.arrival and r.arrival not in scheduled
            ]
            if not victims:
                self.preempt(req)
                return False
            self.preempt(victims[-1])  # running is by arrival: the last is the lowest priority
        return True

    def _num_drafts(self, req: Request, num_new: int, budget_left: int) -> int:
        """How many draft tokens ``req``'s decode row may verify after its ``num_new`` tokens."""
        k = self.num_speculative_tokens
        if k == 0:
            return 0
        room = min(
            k,
            req.params.max_tokens - req.num_generated - 1,  # every emitted token must be allowed
            self.max_model_len - req.num_tokens - 1,  # ... and fit the context
            budget_left,
        )
        if self.kv_cache_tokens is not None:  # the row's own new tokens, reserved, are not yet held
            room = min(room, self._kv_free() - num_new)
        return max(room, 0)

    def _row(self, req: Request, num_new: int, num_drafts: int) -> ScheduledRow:
        row = ScheduledRow(
            req,
            req.num_computed,
            num_new + num_drafts,
            req.num_computed + num_new == req.num_tokens,
            num_drafts,
            req.slot,
            req.admissions,
        )
        req.num_computed += num_new + num_drafts
        if row.samples:
            req.num_inflight += 1
        if num_drafts:
            req.awaiting_drafts = True
            self.stats.drafts_proposed += num_drafts
        return row

    def _admit(self, req: Request) -> None:
        """Seed a request's slot state: it re-prefills everything the host knows about it."""
        req.slot = heapq.heappop(self._free_slots)
        if req.slot in self._used_slots:
            self.stats.slot_reuses += 1
        self._used_slots.add(req.slot)
        previous = self._lost_in_flight.pop(req.slot, None)
        # The previous owner's late token is still in flight only while that owner waits: it is
        # never re-admitted before its in-flight tokens resolved (then num_inflight counts rows of
        # its new slot, and this slot's late token has resolved long ago).
        if previous is not None and previous is not req and previous.slot < 0 and previous.num_inflight:
            self.stats.slots_handed_over_in_flight += 1
        req.prefill_len = req.num_known
        req.num_computed = 0
        req.admissions += 1
        bisect.insort(self.running, req, key=lambda r: r.arrival)

    @staticmethod
    def _slots_by_length(admitted: list[Request], rows: list[ScheduledRow]) -> list[ScheduledRow]:
        """Give the requests admitted together their slots in order of prompt length; returns
        ``rows`` (theirs) carrying the new slots.

        The set of slots is the lowest free ones either way; only who gets which changes. Requests
        of similar length then sit in neighbouring slots as they decode, and a step's decode rows
        attend in fewer, fuller runs of consecutive slots (``tokenstate.models.slot_batch``).
        """
        slots = sorted(req.slot for req in admitted)
        for req, slot in zip(sorted(admitted, key=lambda r: (r.num_known, r.arrival)), slots, strict=True):
            req.slot = slot
        return [replace(row, slot=row.request.slot) for row in rows]

    def schedule(self) -> ScheduledBatch:
        self._release_finishing()
        budget = self.max_num_batched_tokens
        wanting = [r for r in self.running if self._wants_row(r)]
        decode = [r for r in wanting if r.num_computed >= r.prefill_len]
        prefill = [r for r in wanting if r.num_computed < r.prefill_len]
        candidates = [*decode, *prefill]
        if self.order == "random":
            candidates = [candidates[i] for i in self._rng.permutation(len(candidates))]
        rows: list[ScheduledRow] = []
        num_decode = 0
        scheduled: set[int] = set()
        for req in candidates:
            if req.slot < 0:
                continue  # preempted earlier in this step
            if budget == 0:
                self.stats.skipped_rows += 1  # rejoins a later step where it left off
                self.stats.skipped_prefill_rows += req.num_computed < req.prefill_len
                continue
            num_new = min(req.num_tokens - req.num_computed, budget)
            if not self._reserve(req, num_new, scheduled):
                continue
            is_decode = req.num_computed >= req.prefill_len
            drafts = self._num_drafts(req, num_new, budget - num_new) if is_decode else 0
            num_decode += is_decode
            rows.append(self._row(req, num_new, drafts))
            scheduled.add(req.arrival)
            budget -= rows[-1].num_new_tokens
        if self.order == "decode_first":
            # Chosen by priority, placed by slot: the decode rows (the first rows, as their
            # candidates come first) in slot order, so that where their slots are consecutive the
            # attention reads them as one run in batch order, without gathering its queries or
            # scattering its outputs in every layer (tokenstate.models.slot_batch).
            rows[:num_decode] = sorted(rows[:num_decode], key=lambda row: row.slot)
        admitted: list[Request] = []
        while self.waiting and budget > 0 and self._free_slots:
            req = self.waiting[0]
            num_new = min(req.num_known, budget)
            if self.kv_cache_tokens is not None and self._kv_free() < num_new:
                break
            if req.num_inflight:
                # Its in-flight tokens resolve first: it re-prefills all the host knows.
                self.stats.readmissions_held_in_flight += 1
                break
            self.waiting.pop(0)
            self._admit(req)
            admitted.append(req)
            rows.append(self._row(req, num_new, 0))
            budget -= num_new
        if len(admitted) > 1:
            rows[-len(admitted) :] = self._slots_by_length(admitted, rows[-len(admitted) :])
        if self.order == "random" and len(rows) > 1:
            perm = self._rng.permutation(len(rows))
            if np.any(perm != np.arange(len(rows))):
                self.stats.reordered_steps += 1
            rows = [rows[i] for i in perm]
        return ScheduledBatch(tuple(rows), tuple(admitted))

    def preempt(self, req: Request) -> None:
        """Free a running request's slot and KV; it waits (by priority) to re-prefill everything."""
        self.running.remove(req)
        heapq.heappush(self._free_slots, req.slot)
        if req.num_inflight:
            self.stats.preempted_in_flight += 1
            self.stats.preempted_awaiting_drafts += req.awaiting_drafts
            self._lost_in_flight[req.slot] = req
        req.slot = -1
        req.num_computed = 0
        bisect.insort(self.waiting, req, key=lambda r: r.arrival)
        self.stats.preemptions += 1

    def update(
        self,
        batch: ScheduledBatch,
        sampled: np.ndarray,
        *,
        num_sampled: np.ndarray | None = None,
        step: int = 0,
        stale: np.ndarray | None = None,
    ) -> StepUpdate:
        """Apply one step's resolved tokens.

        Args:
            batch: the step's batch.
            sampled: ``[num_logits]`` the token at every logit (``1 + num_drafts`` per sampling row,
                in row order).
            num_sampled: ``[num_sampling_rows]`` tokens each sampling row emitted (``1 +`` accepted
                drafts); ``None`` means one each (no drafts).
            step: the engine step, recorded in each kept token's :class:`TokenOrigin`.
            stale: ``[num_logits]`` whether the logit's input id was spliced on the device.
        """
        tokens = sampled.tolist()
        sampling = batch.sampling_rows
        emitted = [1] * len(sampling) if num_sampled is None else num_sampled.tolist()
        if len(tokens) != batch.num_logits or len(emitted) != len(sampling):
            raise ContractViolation(
                f"Scheduler.update: {len(tokens)} tokens / {len(emitted)} emitted counts for "
                f"{batch.num_logits} logits in {len(sampling)} sampling rows; pass one token per "
                "logit and one count per sampling row of the batch."
            )
        stale_flags = [False] * len(tokens) if stale is None else stale.tolist()
        kept = np.zeros(len(tokens), dtype=bool)  # [num_logits] bool
        record = np.zeros(len(tokens), dtype=bool)  # [num_logits] bool
        finished: list[Request] = []
        i = j = 0
        for row_index, row in enumerate(batch.rows):
            if not row.samples:
                continue
            req, count = row.request, emitted[j]
            accepted = count - 1
            self.stats.drafts_accepted += accepted
            self.stats.drafts_rejected += row.num_drafts - accepted
            same_slot = req.admissions == row.admission and req.slot == row.slot
            if row.num_drafts:
                req.awaiting_drafts = False
                if same_slot:
                    req.num_computed -= row.num_drafts - accepted  # roll back the rejected drafts
            if not req.finished:
                req.num_inflight -= 1
            for k in range(count):
                if not self._emits(req):
                    self.stats.discarded_tokens += 1  # an idle row: its request is done
                    req.num_discarded += 1
                    continue
                kept[i + k] = True
                record[i + k] = same_slot
                req.output_token_ids.append(tokens[i + k])
                req.origins.append(TokenOrigin(step, row_index, stale_flags[i + k]))
                reason = self._stop_reason(req, tokens[i + k])
                if reason is not None:
                    self.finish(req, reason)
                    finished.append(req)
            i += row.num_logits
            j += 1
        return StepUpdate(finished, kept, record)

    @staticmethod
    def _emits(req: Request) -> bool:
        """Whether a token resolved for ``req`` joins its output: never once it has finished."""
        return not req.finished

    def _stop_reason(self, req: Request, token: int) -> FinishReason | None:
        params = req.params
        if (token in req.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if len(req.output_token_ids) >= params.max_tokens or req.num_known >= self.max_model_len:
            return "length"
        return None

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Mark a request finished and free its slot at once (its in-flight rows are discarded).

        Finishing a finished request changes nothing.
        """
        if req.finished:
            return
        req.finish_reason = reason
        if req in self._released:
            self._released.remove(req)  # its slot went to a waiting request already
            return
        if req.slot < 0:
            self.waiting.remove(req)  # preempted with its last token in flight
            return
        self.running.remove(req)
        heapq.heappush(self._free_slots, req.slot)

    def abort_all(self) -> None:
        """Drop every request and free every slot (after an error aborted a generate call)."""
        self.waiting.clear()
        self.running.clear()
        self._released.clear()
        self._free_slots = list(range(self.max_num_seqs))
