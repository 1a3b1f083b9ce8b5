"""The model runner: a step's work between the scheduler's batch and its resolved tokens —
prepare → (upload + combine) → checked forward → penalties / bad words → sample → verify drafts →
post-update → history write → propose drafts → copy back → resolve. The loop that calls it is
:meth:`tokenstate.runtime.engine.Engine.step`.

Everything after the forward runs on the device, reading only slot-indexed device state (the token
history, never the host's view of it), so none of it waits for the host to learn a token.

On the async path the host learns step N's sampled tokens only after step N+1 has been launched:
:meth:`~tokenstate.runtime.engine.Engine.step` launches a batch and *then* resolves the previous one, so decode rows are
prepared with ``PLACEHOLDER`` on the host and the combine kernel splices the slot's last sampled
token in on the device. The device work of a step runs on the runner's stream
(:mod:`tokenstate.runtime.stream`): on the CPU a worker thread, so the host really prepares step
N+1 while step N computes, and every fence between them is a real one that CPU tests exercise.

The opt-in is the mechanism: only a forward whose factory declared ``honors_device_token_ids=True``
receives :class:`~tokenstate.contracts.DeviceTokens`. For any other forward, a step with spliced
rows either falls back to the synchronous host path (resolve now, refill the host buffer, hand fresh
``HostTokens``) or is refused by name; a step without spliced rows is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tokenstate.contracts import (
    BatchLayout,
    ContractViolation,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    IndexPlan,
    StepIndices,
    get_checks_mode,
)
from tokenstate.runtime.engine_config import ON_UNHONORED, EngineConfig, OnUnhonored
from tokenstate.runtime.input_prep import (
    HostStepInputs,
    HostTokenTable,
    prepare_inputs,
    refresh_inputs,
)
from tokenstate.runtime.kernels import StepGuard, combine, post_update, verify_drafts
from tokenstate.runtime.mirror import DeviceMirror, DeviceStepInputs, PendingTokens, StagedStep
from tokenstate.runtime.penalties import apply_penalties, ban_bad_words, plan_bad_words
from tokenstate.runtime.prefault import fault_in_lazy_pages
from tokenstate.runtime.registry import ModelFactory
from tokenstate.runtime.sampler import SamplingRows, sample, sample_greedy
from tokenstate.runtime.scheduler import Request, ScheduledBatch
from tokenstate.runtime.slot_memory import (
    check_slot_state_fits,
    slot_state_allocation,
    step_state_allocation,
)
from tokenstate.runtime.spec_decode import propose_ngram
from tokenstate.runtime.stream import stream_for

__all__ = ["ON_UNHONORED", "InFlight", "ModelRunner", "OnUnhonored", "Resolved", "StepSampling"]

BadWordEntry = tuple[int, int, int, tuple[tuple[int, ...], ...]]
"""``(logit, slot, sampled position, words)``: one logit of a row whose request bans words."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A launched step whose sampled tokens the host has not resolved yet."""

    step: int  # the engine step's index
    batch: ScheduledBatch
    prepared: HostStepInputs
    pending: PendingTokens


@dataclass(frozen=True, slots=True)
class StepSampling:
    """What a step's device work needs to know of its requests, decided on the host at launch.

    The device work reads this and slot-indexed device state, never the batch's requests or the
    host's arrays: on a device process a step's hand-over carries these few numbers instead of a
    row object per request and the host arrays (as a GPU worker receives sampling metadata, not
    requests). The per-slot values (temperature, top-k/top-p, seeds, penalties) were seeded on the
    device at admission; only facts about the step's set of rows travel here.
    """

    num_logits: int
    all_greedy: bool  # every sampling row is greedy: the sampler takes the argmax fast path
    any_filter: bool  # some sampling row uses top-k or top-p
    any_penalty: bool  # some sampling row has a repetition, presence or frequency penalty
    penalty_window: int  # with any_penalty: the longest sampled position (the history to count)
    bad_words: tuple[BadWordEntry, ...]  # one entry per logit of each row that bans words
    writes_drafts: bool  # the input carries drafts and some sampling row reads the history
    has_drafts: bool  # some row carries drafts: the step verifies them
    proposal_bound: int  # speculative: one past the longest sequence (the n-gram search bound)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A step's results on the host, split by meaning."""

    tokens: np.ndarray  # [num_logits] int32, the token at every logit
    num_sampled: np.ndarray  # [num_sampling_rows] int32, 1 + accepted drafts
    stale: np.ndarray  # [num_logits] bool, whether the logit's input id was spliced on the device
    drafts: np.ndarray | None  # [num_rows, num_drafts] int32, the next drafts (speculative only)


class ModelRunner:
    """Runs steps of one model: owns the host token table, the device stream and the mirror.

    The engine (:class:`~tokenstate.runtime.engine.Engine`) drives it: :meth:`prepare`,
    :meth:`launch`, :meth:`resolve`, :meth:`record`.
    """

    def __init__(self, factory: ModelFactory, model: Any, config: EngineConfig) -> None:
        self.factory = factory
        self.model = model
        self.device = config.device
        self.async_scheduling = config.async_scheduling
        self.on_unhonored: OnUnhonored = config.on_unhonored
        self.speculative = config.speculative
        self.num_drafts = config.num_speculative_tokens
        max_model_len = int(model.max_model_len)
        max_num_seqs, budget = config.max_num_seqs, config.max_num_batched_tokens
        self.chaos = config.chaos
        # Every device write goes through this stream, in order; the host only waits on its events.
        self.stream = stream_for(self.device, config.chaos, config.cpu_stream)
        with slot_state_allocation(max_num_seqs, max_model_len):
            self.table = HostTokenTable(max_num_seqs, max_model_len)
        with step_state_allocation(budget, max_num_seqs, max_model_len):
            self.mirror = DeviceMirror(
                max_num_seqs,
                self.stream,
                max_model_len=max_model_len,
                max_drafts=self.num_drafts,
                capacity=3 * budget + 12 * max_num_seqs * (1 + self.num_drafts) + 2,
            )
        with slot_state_allocation(max_num_seqs, max_model_len), torch.inference_mode():
            model.allocate_slots(max_num_seqs)
        check_slot_state_fits(model, max_num_seqs, max_model_len)  # before the first task backs it
        # The device side is complete: a stream whose device is another process forks it here.
        self.stream.start((self, self.model, *self.mirror.device_objects()))
        # Its first task backs the slot state with memory, so no request pays those page faults.
        self.stream.submit(self._fault_in_slot_state)
        self._num_launched = 0

    def _fault_in_slot_state(self) -> None:
        """Device task: back the model's lazily mapped slot state (KV caches) with memory now."""
        fault_in_lazy_pages(self.model)

    def prepare(self, batch: ScheduledBatch) -> HostStepInputs:
        """Admit the batch's new requests and build its host inputs (placeholders where stale)."""
        self._host_pause()
        self._admit(batch.admitted)
        return prepare_inputs(batch, self.table, spliced=self.async_scheduling)

    def needs_fresh_host_ids(self, prepared: HostStepInputs) -> bool:
        """Whether this step must wait for every pending token first (sync engine, or fallback).

        Raises the refusal for a non-opting forward under ``on_unhonored="refuse"``.
        """
        if not self.async_scheduling:
            return True
        if prepared.has_stale and not self.factory.honors_device_token_ids:
            self._refuse_or_fall_back(prepared)
            return True
        return False

    def refresh(self, batch: ScheduledBatch, prepared: HostStepInputs) -> HostStepInputs:
        """The step on fresh host ids, once the host knows every token (only async steps change)."""
        return refresh_inputs(prepared, self.table, batch) if prepared.has_stale else prepared

    def launch(self, batch: ScheduledBatch, prepared: HostStepInputs) -> InFlight:
        """Submit the step; combine runs when some row is stale and the forward honors device ids."""
        use_combine = self.async_scheduling and self.factory.honors_device_token_ids
        launched = self._launch(batch, prepared, use_combine=use_combine)
        self._host_pause()
        return launched

    def _host_pause(self) -> None:
        if self.chaos is not None:
            self.chaos.host_pause()

    def _refuse_or_fall_back(self, prepared: HostStepInputs) -> None:
        if self.on_unhonored == "refuse":
            raise ContractViolation(
                f"model {self.factory.name!r}: this async step has spliced rows "
                f"{list(prepared.host_tokens.stale_rows)} whose real token ids exist only on the "
                f"device, but factory {self.factory.name!r} did not declare "
                "honors_device_token_ids=True, and on_unhonored='refuse'. Fix: make its forward read "
                "inp.device_tokens.ids (or inp.embedding_ids()) and register it with "
                "honors_device_token_ids=True; or use on_unhonored='fallback' (synchronous host path "
                "for such steps) or async_scheduling=False."
            )

    def _admit(self, admitted: tuple[Request, ...]) -> None:
        if not admitted:
            return
        for req in admitted:
            self.table.admit(req)
        # The model's slot state and the mirror's are reseeded in stream order: behind the in-flight
        # step, which may still write the slot's previous occupant.
        self.stream.submit(self._reset_model_slots, tuple(req.slot for req in admitted))
        self.mirror.admit(admitted)

    def _reset_model_slots(self, slots: tuple[int, ...]) -> None:
        for slot in slots:
            self.model.reset_slot(slot)

    def _step_sampling(self, batch: ScheduledBatch, prepared: HostStepInputs) -> StepSampling:
        """On the host, at launch: what the step's device work needs to know of its requests."""
        params = [row.request.params for row in batch.sampling_rows]
        any_penalty = any(
            p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params
        )
        bad_words: tuple[BadWordEntry, ...] = ()
        if any(p.bad_words for p in params):
            cu = prepared.cu_num_logits
            # Every logit of a row, drafts' included: each one samples a position of its own.
            bad_words = tuple(
                (i, row.slot, int(prepared.sample_positions[i]), row.request.params.bad_words)
                for r, row in enumerate(batch.rows)
                if row.samples and row.request.params.bad_words
                for i in range(int(cu[r]), int(cu[r + 1]))
            )  # fmt: skip
        return StepSampling(
            num_logits=prepared.num_logits,
            all_greedy=all(p.greedy for p in params),
            any_filter=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
            any_penalty=any_penalty,
            penalty_window=int(prepared.sample_positions.max()) if any_penalty else 0,
            bad_words=bad_words,
            writes_drafts=bool(prepared.draft_logits.size) and any(p.reads_history for p in params),
            has_drafts=bool(np.count_nonzero(prepared.num_drafts)),
            proposal_bound=int(prepared.seq_lens.max()) + 1 if self.speculative is not None else 0,
        )

    def _sampling_rows(self, sampling: StepSampling, dev: DeviceStepInputs) -> SamplingRows:
        mirror, slots = self.mirror, dev.sample_slots
        return SamplingRows(
            temperature=mirror.temperature.index_select(0, slots),
            top_k=mirror.top_k.index_select(0, slots),
            top_p=mirror.top_p.index_select(0, slots),
            seeds=mirror.seed.index_select(0, slots),
            output_index=dev.sample_output_index,
            all_greedy=sampling.all_greedy,
            any_filter=sampling.any_filter,
        )

    def _history_source(self) -> torch.Tensor:
        """The token history the history-reading processors use: the device's, never the host's.

        Taken on the host when the step is launched (a reference to the device tensor, no read).
        """
        return self.mirror.history  # [num_slots, max_model_len] int32

    def _process_logits(
        self, sampling: StepSampling, dev: DeviceStepInputs, logits: torch.Tensor,
        history: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Penalties and bad words, from the device history (``logits`` ``[num_logits, vocab]``)."""
        mirror, slots = self.mirror, dev.sample_slots
        if sampling.any_penalty:
            logits = apply_penalties(
                logits, history, slots, dev.sample_positions, dev.sample_output_index,
                mirror.repetition_penalty.index_select(0, slots),
                mirror.presence_penalty.index_select(0, slots),
                mirror.frequency_penalty.index_select(0, slots),
                length=sampling.penalty_window,
            )  # fmt: skip
        if sampling.bad_words:
            plan = plan_bad_words(
                sampling.bad_words, max_model_len=self.mirror.max_model_len, device=self.device
            )
            if plan is not None:
                logits = ban_bad_words(logits, history, plan)
        return logits

    def _write_drafts_to_history(self, dev: DeviceStepInputs) -> None:
        """On the stream: put this step's drafts into the device history at the positions they hold.

        The logit at draft position ``j`` of a row is verified as if drafts ``0..j-1`` were accepted
        (if one is not, the logit is discarded), so its penalties and bad words must see them in
        the history too. The sampled tokens written after verification overwrite every one of these
        positions, so the history ends the step exactly as it would without this write.
        """
        mirror = self.mirror
        drafts = mirror.draft_tokens.view(-1).index_select(0, dev.draft_source)  # [num_draft_logits]
        mirror.history.view(-1).index_copy_(0, dev.draft_history_index, drafts)

    def _launch(
        self, batch: ScheduledBatch, prepared: HostStepInputs, *, use_combine: bool
    ) -> InFlight:
        """Stage the step's inputs and submit its device work; the host does not wait for it."""
        plan = self._plan_indices(prepared.layout)
        staged = self.mirror.stage(prepared, plan, host_ids=use_combine)
        guard = StepGuard()
        num_rows = len(batch.rows)
        results = self.mirror.results_buffer(
            prepared.num_logits + num_rows + (num_rows * self.num_drafts if self.speculative else 0)
        )  # [n] int32 host buffer: sampled tokens, emitted counts, next drafts
        history = self._history_source()  # [num_slots, max_model_len] int32
        sampling = self._step_sampling(batch, prepared)
        self.stream.submit(
            self._device_step, sampling, prepared.host_tokens, prepared.layout,
            None if plan is None else plan.meta, staged, use_combine, guard, results, history,
        )  # fmt: skip
        event = self.stream.record_event()
        self.mirror.fence(staged, event)  # the step's device work copied its staging buffers in
        pending = PendingTokens(results, event, guard, prepared.layout)
        self._num_launched += 1
        return InFlight(self._num_launched - 1, batch, prepared, pending)

    def _plan_indices(self, layout: BatchLayout) -> IndexPlan | None:
        """The model's index arrays of the step, built on the host (uploaded with its inputs)."""
        plan_indices = self.factory.plan_indices
        return None if plan_indices is None else plan_indices(self.model, layout)

    def _device_step(
        self, sampling: StepSampling, host_tokens: HostTokens, layout: BatchLayout,
        plan_meta: object, staged: StagedStep, use_combine: bool, guard: StepGuard,
        results: torch.Tensor, history: torch.Tensor,
    ) -> None:  # fmt: skip
        """On the stream: copy in → combine → checked forward → sample → post-update → history →
        drafts → copy back.

        Reads the step's staged inputs (``staged``), its host ids and layout (the forward's
        input), the host-only facts of the model's index plan (``plan_meta``; ``None`` without a
        plan), what the host decided about its requests (``sampling``) and slot-indexed device state.
        """
        mirror = self.mirror
        dev = staged.copy_in()
        if plan_meta is not None:
            # The forward's index tensors travel in the step's layout: it uploads none of its own.
            layout = layout.with_indices(StepIndices(plan_meta, dev.model_indices))
        # The kernels' operands are the mirror's own views, right by construction: their metadata
        # checks (which cost as much as the CPU twins) run in ``full`` checks mode only.
        validate = get_checks_mode() == "full"
        device_tokens = None
        logits_indices = dev.logits_indices  # [num_logits] int64
        if use_combine:
            ids, logits_indices = combine(
                dev.host_ids, dev.query_start_loc, dev.seq_lens, dev.slots, dev.num_drafts,
                mirror.prefill_len, mirror.last_sampled, mirror.draft_tokens, dev.cu_num_logits,
                num_logits=sampling.num_logits, validate=validate,
            )  # fmt: skip
            device_tokens = DeviceTokens.from_combine(ids, vocab_size=self.model.vocab_size)
        inp = ForwardInput(
            host_tokens=host_tokens,
            device_tokens=device_tokens,
            positions=dev.positions,
            layout=layout,  # prepared.layout with the model's uploaded indices
            logits_indices=logits_indices,
            slots=dev.slots_long,
        )
        with guard:
            logits = self.factory.forward(self.model, inp)  # [num_logits, vocab] float32
        if sampling.writes_drafts:
            self._write_drafts_to_history(dev)
        logits = self._process_logits(sampling, dev, logits, history)
        if sampling.all_greedy:  # the argmax reads no per-row parameter: gather none
            sampled = sample_greedy(logits)  # [num_logits] int32
        else:
            sampled = sample(logits, self._sampling_rows(sampling, dev))  # [num_logits] int32
        keep = dev.cu_num_logits[1:] > dev.cu_num_logits[:-1]  # [num_rows] bool: the row samples
        if sampling.has_drafts:
            num_sampled = verify_drafts(
                sampled, dev.cu_num_logits, dev.slots, mirror.draft_tokens, dev.num_drafts
            )  # [num_rows] int32: 1 + accepted drafts
        else:
            num_sampled = keep.to(torch.int32)  # [num_rows] int32
        post_update(
            sampled, dev.cu_num_logits, num_sampled, keep, dev.query_start_loc, dev.num_drafts,
            dev.slots, mirror.last_sampled, mirror.num_computed, validate=validate,
        )  # fmt: skip
        # Every logit's token at the position it predicts; a rejected draft's lies beyond the
        # slot's length and is overwritten before anything reads it.
        mirror.history.view(-1).index_copy_(0, dev.history_index, sampled)
        packed = [sampled, num_sampled]
        if self.speculative is not None:
            drafts = propose_ngram(
                mirror.history, dev.slots_long, mirror.num_computed.index_select(0, dev.slots_long) + 1,
                ngram_size=self.speculative.ngram_size, num_drafts=self.num_drafts,
                length_bound=sampling.proposal_bound,
            )  # [num_rows, k] int32  # fmt: skip
            mirror.draft_tokens.index_copy_(0, dev.slots_long, drafts)
            packed.append(drafts.flatten())
        mirror.copy_results(results, torch.cat(packed))

    def resolve(self, in_flight: InFlight) -> Resolved:
        """Wait for the step's results (its one sync point; raises recorded violations)."""
        packed = in_flight.pending.resolve()  # [n] int32
        prepared, batch = in_flight.prepared, in_flight.batch
        num_logits, num_rows = prepared.num_logits, len(batch.rows)
        samples = np.array([row.samples for row in batch.rows], dtype=bool)  # [num_rows]
        drafts = None
        if self.speculative is not None:
            drafts = packed[num_logits + num_rows :].reshape(num_rows, self.num_drafts)
        return Resolved(
            tokens=packed[:num_logits],
            num_sampled=packed[num_logits : num_logits + num_rows][samples],
            stale=prepared.host_tokens.stale.numpy()[prepared.logits_indices],
            drafts=drafts,
        )

    def record(self, in_flight: InFlight, resolved: Resolved, record: np.ndarray) -> None:
        """Tell the host table the tokens the scheduler kept (``record`` ``[num_logits]`` bool)."""
        prepared, batch = in_flight.prepared, in_flight.batch
        self.table.record(
            prepared.sample_slots[record], prepared.sample_positions[record], resolved.tokens[record]
        )
        if resolved.drafts is not None:
            for r, row in enumerate(batch.rows):
                req = row.request
                if row.samples and req.admissions == row.admission and req.slot == row.slot:
                    req.host_drafts = tuple(resolved.drafts[r].tolist())

    def abort(self) -> None:
        """Drain the stream and drop the error it may have kept (after an aborted generate call)."""
        self.stream.reset()

    def close(self) -> None:
        """Stop the stream's worker thread or device process (idempotent)."""
        self.stream.close()
