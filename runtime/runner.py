"""The model runner: one step = schedule → prepare → (upload + combine) → checked forward →
penalties / bad words → sample → verify drafts → post-update → history write → propose drafts →
resolve.

Everything after the forward runs on the device, reading only slot-indexed device state (the token
history, never the host's view of it), so none of it waits for the host to learn a token.

On the async path the host learns step N's sampled tokens only after step N+1 has been launched:
:meth:`ModelRunner.step` launches its batch and *then* resolves the previous one, so decode rows are
prepared with ``PLACEHOLDER`` on the host and the combine kernel splices the slot's last sampled
token in on the device. That runs on the CPU as well (the mirror's CPU data flow), so every CPU test
reaches the async branch.

The opt-in is the mechanism: only a forward whose factory declared ``honors_device_token_ids=True``
receives :class:`~tokenstate.contracts.DeviceTokens`. For any other forward, a step with spliced
rows either falls back to the synchronous host path (resolve now, refill the host buffer, hand fresh
``HostTokens``) or is refused by name; a step without spliced rows is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from tokenstate.contracts import ContractViolation, DeviceTokens, ForwardInput, TokenStateError
from tokenstate.runtime.input_prep import (
    HostStepInputs,
    HostTokenTable,
    prepare_inputs,
    refresh_inputs,
)
from tokenstate.runtime.kernels import StepGuard, combine, post_update, verify_drafts
from tokenstate.runtime.mirror import DeviceMirror, DeviceStepInputs, PendingTokens
from tokenstate.runtime.outputs import EngineStats
from tokenstate.runtime.penalties import apply_penalties, ban_bad_words, plan_bad_words
from tokenstate.runtime.registry import ModelFactory
from tokenstate.runtime.sampler import SamplingRows, sample
from tokenstate.runtime.scheduler import Request, ScheduledBatch, Scheduler, SchedulingOrder
from tokenstate.runtime.spec_decode import SpeculativeConfig, propose_ngram
from tokenstate.runtime.watchdog import ProgressWatchdog, default_stall_limit

__all__ = ["ON_UNHONORED", "ModelRunner", "OnUnhonored"]

OnUnhonored = Literal["fallback", "refuse"]
ON_UNHONORED: tuple[str, ...] = ("fallback", "refuse")


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A launched step whose sampled tokens the host has not resolved yet."""

    step: int  # the engine step's index
    batch: ScheduledBatch
    prepared: HostStepInputs
    pending: PendingTokens


class ModelRunner:
    """Runs steps of one model; owns the scheduler, the host token table and the device mirror."""

    def __init__(
        self,
        factory: ModelFactory,
        model: Any,
        *,
        device: torch.device,
        async_scheduling: bool,
        on_unhonored: OnUnhonored,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        stats: EngineStats,
        kv_cache_tokens: int | None = None,
        scheduling_order: SchedulingOrder = "decode_first",
        seed: int = 0,
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        self.factory = factory
        self.model = model
        self.device = device
        self.async_scheduling = async_scheduling
        self.on_unhonored = on_unhonored
        self.stats = stats
        self.speculative = speculative
        self.num_drafts = 0 if speculative is None else speculative.num_tokens
        max_model_len = int(model.max_model_len)
        self.scheduler = Scheduler(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            kv_cache_tokens=kv_cache_tokens,
            order=scheduling_order,
            seed=seed,
            num_speculative_tokens=self.num_drafts,
            stats=stats,
        )
        self.table = HostTokenTable(max_num_seqs, max_model_len)
        self.mirror = DeviceMirror(
            max_num_seqs,
            device,
            max_model_len=max_model_len,
            max_drafts=self.num_drafts,
            capacity=3 * max_num_batched_tokens + 12 * max_num_seqs * (1 + self.num_drafts) + 2,
        )
        with torch.inference_mode():
            model.allocate_slots(max_num_seqs)
        self._in_flight: _InFlight | None = None
        self._num_launched = 0
        self.watchdog = ProgressWatchdog(default_stall_limit(max_model_len, max_num_batched_tokens))

    @property
    def has_pending(self) -> bool:
        return self._in_flight is not None

    def step(self) -> list[Request]:
        """Run one step; returns the requests whose finish the host learned in it."""
        with torch.inference_mode():
            finished = self._step()
        self.watchdog.after_step((*self.scheduler.running, *self.scheduler.waiting), len(finished))
        return finished

    def _step(self) -> list[Request]:
        batch = self.scheduler.schedule()
        if not batch.rows:
            if self._in_flight is None:
                raise TokenStateError(
                    "runner stalled: requests are unfinished but none can be scheduled and no step is "
                    "in flight (a scheduler invariant broke; please report it)."
                )
            return self._resolve_pending()
        self._admit(batch.admitted)
        prepared = prepare_inputs(batch, self.table, spliced=self.async_scheduling)
        finished: list[Request] = []
        honors = self.factory.honors_device_token_ids
        if not self.async_scheduling:
            launched = self._launch(batch, prepared, use_combine=False)
            self.stats.sync_steps += 1
            return self._resolve(launched)
        fallback = prepared.has_stale and not honors
        if fallback:
            self._refuse_or_fall_back(prepared)
            finished += self._resolve_pending()  # the sync point: the host now knows every token
            prepared = refresh_inputs(prepared, self.table, batch)
        launched = self._launch(batch, prepared, use_combine=honors)
        if fallback:
            self.stats.fallback_steps += 1
        else:
            self.stats.async_steps += 1
        finished += self._resolve_pending()  # the previous step, resolved after this one launched
        self._in_flight = launched
        return finished

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
        for req in admitted:
            self.model.reset_slot(req.slot)
            self.table.admit(req)
        self.mirror.admit(admitted)

    def _sampling_rows(self, batch: ScheduledBatch, dev: DeviceStepInputs) -> SamplingRows:
        params = [row.request.params for row in batch.sampling_rows]
        mirror, slots = self.mirror, dev.sample_slots
        return SamplingRows(
            temperature=mirror.temperature.index_select(0, slots),
            top_k=mirror.top_k.index_select(0, slots),
            top_p=mirror.top_p.index_select(0, slots),
            seeds=mirror.seed.index_select(0, slots),
            output_index=dev.sample_output_index,
            all_greedy=all(p.greedy for p in params),
            any_filter=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
        )

    def _history_source(self) -> torch.Tensor:
        """The token history the history-reading processors use: the device's, never the host's."""
        return self.mirror.history  # [num_slots, max_model_len] int32

    def _process_logits(
        self, batch: ScheduledBatch, prepared: HostStepInputs, dev: DeviceStepInputs,
        logits: torch.Tensor,
    ) -> torch.Tensor:
        """Penalties and bad words, from the device history (``logits`` ``[num_logits, vocab]``)."""  # fmt: skip
        params = [row.request.params for row in batch.sampling_rows]
        mirror, slots = self.mirror, dev.sample_slots
        if any(p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params):
            logits = apply_penalties(
                logits, self._history_source(), slots, dev.sample_positions, dev.sample_output_index,
                mirror.repetition_penalty.index_select(0, slots),
                mirror.presence_penalty.index_select(0, slots),
                mirror.frequency_penalty.index_select(0, slots),
                length=int(prepared.sample_positions.max()),
            )  # fmt: skip
        if any(p.bad_words for p in params):
            cu = prepared.cu_num_logits
            entries = [
                (int(cu[r]), row.slot, int(prepared.sample_positions[cu[r]]), row.request.params.bad_words)
                for r, row in enumerate(batch.rows)
                if row.samples and row.request.params.bad_words
            ]  # fmt: skip
            plan = plan_bad_words(entries, max_model_len=self.mirror.max_model_len, device=self.device)
            if plan is not None:
                logits = ban_bad_words(logits, self._history_source(), plan)
        return logits

    def _launch(
        self, batch: ScheduledBatch, prepared: HostStepInputs, *, use_combine: bool
    ) -> _InFlight:
        mirror = self.mirror
        dev = mirror.upload(prepared)
        device_tokens = None
        logits_indices = dev.logits_indices  # [num_logits] int64
        if use_combine:
            ids, logits_indices = combine(
                dev.host_ids, dev.query_start_loc, dev.seq_lens, dev.slots, dev.num_drafts,
                mirror.prefill_len, mirror.last_sampled, mirror.draft_tokens, dev.cu_num_logits,
                num_logits=prepared.num_logits,
            )  # fmt: skip
            device_tokens = DeviceTokens.from_combine(ids, vocab_size=self.model.vocab_size)
        inp = ForwardInput(
            host_tokens=prepared.host_tokens,
            device_tokens=device_tokens,
            positions=dev.positions,
            layout=prepared.layout,
            logits_indices=logits_indices,
            slots=dev.slots_long,
        )
        guard = StepGuard()
        with guard:
            logits = self.factory.forward(self.model, inp)  # [num_logits, vocab] float32
        logits = self._process_logits(batch, prepared, dev, logits)
        sampled = sample(logits, self._sampling_rows(batch, dev))  # [num_logits] int32
        keep = dev.cu_num_logits[1:] > dev.cu_num_logits[:-1]  # [num_rows] bool: the row samples
        if prepared.num_drafts.any():
            num_sampled = verify_drafts(
                sampled, dev.cu_num_logits, dev.slots, mirror.draft_tokens, dev.num_drafts
            )  # [num_rows] int32: 1 + accepted drafts
        else:
            num_sampled = keep.to(torch.int32)  # [num_rows] int32
        post_update(
            sampled, dev.cu_num_logits, num_sampled, keep, dev.query_start_loc, dev.num_drafts,
            dev.slots, mirror.last_sampled, mirror.num_computed,
        )  # fmt: skip
        # Every logit's token at the position it predicts; a rejected draft's lies beyond the
        # slot's length and is overwritten before anything reads it.
        mirror.history.view(-1).index_copy_(0, dev.history_index, sampled)
        results = [sampled, num_sampled]
        if self.speculative is not None:
            drafts = propose_ngram(
                mirror.history, dev.slots_long, mirror.num_computed.index_select(0, dev.slots_long) + 1,
                ngram_size=self.speculative.ngram_size, num_drafts=self.num_drafts,
                length_bound=int(prepared.seq_lens.max()) + 1,
            )  # [num_rows, k] int32  # fmt: skip
            mirror.draft_tokens.index_copy_(0, dev.slots_long, drafts)
            results.append(drafts.flatten())
        self._num_launched += 1
        pending = mirror.start_copy(torch.cat(results), guard, prepared.layout)
        return _InFlight(self._num_launched - 1, batch, prepared, pending)

    def _resolve_pending(self) -> list[Request]:
        in_flight, self._in_flight = self._in_flight, None
        return [] if in_flight is None else self._resolve(in_flight)

    def _resolve(self, in_flight: _InFlight) -> list[Request]:
        packed = in_flight.pending.resolve()  # [n] int32; raises recorded violations
        prepared, batch = in_flight.prepared, in_flight.batch
        num_logits, num_rows = prepared.num_logits, len(batch.rows)
        tokens = packed[:num_logits]  # [num_logits] int32
        num_sampled = packed[num_logits : num_logits + num_rows]  # [num_rows] int32
        samples = np.array([row.samples for row in batch.rows], dtype=bool)  # [num_rows]
        stale = prepared.host_tokens.stale.numpy()[prepared.logits_indices]  # [num_logits] bool
        update = self.scheduler.update(
            batch, tokens, num_sampled=num_sampled[samples], step=in_flight.step, stale=stale
        )
        record = update.record
        self.table.record(
            prepared.sample_slots[record], prepared.sample_positions[record], tokens[record]
        )
        if self.speculative is not None:
            drafts = packed[num_logits + num_rows :].reshape(num_rows, self.num_drafts)
            for r, row in enumerate(batch.rows):
                req = row.request
                if row.samples and req.admissions == row.admission and req.slot == row.slot:
                    req.host_drafts = tuple(drafts[r].tolist())
        return update.finished

    def abort(self) -> None:
        """Forget every request and the in-flight step (after an error aborted a generate call)."""
        self._in_flight = None
        self.scheduler.abort_all()
        self.watchdog.reset()
