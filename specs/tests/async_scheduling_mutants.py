"""Mutants of the async-scheduling spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "ASY-1/resume-keeps-prefill-len",
    doc="A request resumed after preemption keeps the prefill_len of its first admission (its prompt "
    "length), so the re-prefill of its generated tokens counts as spliced and the placeholder "
    "buffer's unresolved 'last token' reaches the embedding.",
)
def resume_keeps_prefill_len(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    admit = Scheduler._admit

    def admit_keeping(self: Scheduler, req: Any) -> None:
        resumed = req.admissions > 0
        admit(self, req)
        if resumed:
            req.prefill_len = len(req.prompt)

    patch.setattr(Scheduler, "_admit", admit_keeping)


@mutant(
    "ASY-2/sampling-state-by-row",
    doc="The sampler gathers each row's temperature, top-k/top-p and seed by batch row instead of "
    "by slot — harmless while row r happens to hold slot r, wrong once rows are reordered.",
)
def sampling_state_by_row(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    original = ModelRunner._sampling_rows

    def by_row(self: ModelRunner, sampling: Any, dev: Any) -> Any:
        rows = original(self, sampling, dev)
        mirror = self.mirror
        index = torch.arange(dev.sample_slots.shape[0]) % mirror.seed.shape[0]  # [num_logits]
        return dataclasses.replace(
            rows,
            temperature=mirror.temperature.index_select(0, index),
            top_k=mirror.top_k.index_select(0, index),
            top_p=mirror.top_p.index_select(0, index),
            seeds=mirror.seed.index_select(0, index),
        )

    patch.setattr(ModelRunner, "_sampling_rows", by_row)


@mutant(
    "ASY-3/combine-ignores-drafts",
    doc="The runner launches combine without the rows' draft counts, so the draft positions keep "
    "the host buffer's placeholders (and the last sampled token lands on the wrong position).",
)
def combine_ignores_drafts(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    combine = runner_module.combine

    def combine_without_drafts(
        host_ids: torch.Tensor, qsl: torch.Tensor, seq_lens: torch.Tensor, slots: torch.Tensor,
        num_drafts: torch.Tensor, *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        return combine(host_ids, qsl, seq_lens, slots, torch.zeros_like(num_drafts), *args, **kwargs)

    patch.setattr(runner_module, "combine", combine_without_drafts)


@mutant(
    "ASY-4/penalties-read-host-history",
    doc="Penalties and bad words read the host token table (placeholders read as token 0) instead "
    "of the device history: on the async path the newest token is missing from what they see.",
)
def penalties_read_host_history(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    def host_history(self: ModelRunner) -> torch.Tensor:
        return torch.from_numpy(self.table.ids).clamp(min=0)

    patch.setattr(ModelRunner, "_history_source", host_history)


@mutant(
    "ASY-5/idle-rows-emit",
    doc="The scheduler appends every resolved token, also one sampled in a row scheduled after its "
    "request had already finished (the async engine learns the finish one step late).",
)
def idle_rows_emit(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    patch.setattr(Scheduler, "_emits", staticmethod(lambda req: True))


@mutant(
    "ASY-6/reused-slot-keeps-history",
    doc="Admission reseeds a slot's counters and sampling parameters but not its token history, so "
    "a new request's penalties and bad words see the previous occupant's tokens.",
)
def reused_slot_keeps_history(patch: MutantPatch) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    reseed = DeviceMirror._reseed  # runs on the stream, in order with the steps

    def reseed_keeping_history(self: DeviceMirror, *args: Any) -> None:
        kept = self.history.clone()
        reseed(self, *args)
        self.history.copy_(kept)

    patch.setattr(DeviceMirror, "_reseed", reseed_keeping_history)


@mutant(
    "ASY-8/record-into-lost-slot",
    doc="The host records every kept token into the slot its row was scheduled in, also when the "
    "request lost that slot meanwhile (preempted while the token was in flight): the late token "
    "lands in the host token table of the slot's next owner.",
)
def record_into_lost_slot(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler, StepUpdate

    update = Scheduler.update

    def recording_every_kept(self: Scheduler, *args: Any, **kwargs: Any) -> StepUpdate:
        result = update(self, *args, **kwargs)
        return StepUpdate(result.finished, result.kept, result.kept.copy())

    patch.setattr(Scheduler, "update", recording_every_kept)


@mutant(
    "ASY-9/fallback-feeds-drafts-known-at-scheduling",
    doc="A fallback step feeds the drafts the host knew when it scheduled the step, not the ones it "
    "learns at the step's own sync point: the previous step's drafts, proposed on the device, are "
    "not known yet when the next step is scheduled.",
)
def fallback_feeds_drafts_known_at_scheduling(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    runner_module = importlib.import_module("tokenstate.runtime.runner")
    schedule, refresh = Scheduler.schedule, runner_module.refresh_inputs
    known: dict[int, tuple[int, ...]] = {}

    def schedule_noting_drafts(self: Scheduler) -> Any:
        batch = schedule(self)
        known.update({id(row.request): row.request.host_drafts for row in batch.rows})
        return batch

    def refresh_with_scheduled_drafts(prepared: Any, table: Any, batch: Any) -> Any:
        learnt = [(row.request, row.request.host_drafts) for row in batch.rows]
        for req, _ in learnt:
            req.host_drafts = known.get(id(req), ())
        try:
            return refresh(prepared, table, batch)
        finally:
            for req, drafts in learnt:
                req.host_drafts = drafts

    patch.setattr(Scheduler, "schedule", schedule_noting_drafts)
    patch.setattr(runner_module, "refresh_inputs", refresh_with_scheduled_drafts)


@mutant(
    "ASY-10/bad-words-read-host-table",
    doc="Bad-word matching reads the host token table (placeholders read as token 0) while the "
    "penalties keep reading the device history: on the async path a word whose prefix is the "
    "newest token never matches, so its last token is not banned.",
)
def bad_words_read_host_table(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    model_runner = runner_module.ModelRunner
    ban, step_sampling = runner_module.ban_bad_words, model_runner._step_sampling
    # What the host's table held when it launched the step (the device work may run later, on the
    # stream, after the host has learnt more): the view a host-side consumer really reads.
    at_launch: dict[int, torch.Tensor] = {}

    def sampling_noting_table(self: Any, batch: Any, prepared: Any) -> Any:
        sampling = step_sampling(self, batch, prepared)
        at_launch[id(sampling)] = torch.from_numpy(self.table.ids.copy()).clamp(min=0)
        return sampling

    def process_with_host_table(self: Any, sampling: Any, dev: Any, logits: torch.Tensor,
                                history: torch.Tensor) -> torch.Tensor:  # fmt: skip
        host = at_launch.pop(id(sampling), None)
        with _bad_words_history(runner_module, ban, None if host is None else host.to(history.device)):
            return process(self, sampling, dev, logits, history)

    process = model_runner._process_logits
    patch.setattr(model_runner, "_step_sampling", sampling_noting_table)
    patch.setattr(model_runner, "_process_logits", process_with_host_table)


class _bad_words_history:
    """Within the block, ``ban_bad_words`` matches against ``history`` instead of its argument."""

    def __init__(self, module: Any, ban: Any, history: torch.Tensor | None) -> None:
        self.module, self.ban, self.history = module, ban, history

    def __enter__(self) -> None:
        if self.history is not None:
            history, ban = self.history, self.ban
            self.module.ban_bad_words = lambda logits, _history, plan: ban(logits, history, plan)

    def __exit__(self, *exc: object) -> None:
        self.module.ban_bad_words = self.ban


@mutant(
    "ASY-11/rollback-after-preemption",
    doc="Resolving a row with drafts rolls the rejected drafts back from the request's num_computed "
    "even when the request lost its slot in between (preempted, num_computed already reset to 0).",
)
def rollback_after_preemption(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    update = Scheduler.update

    def rolling_back_lost_rows(self: Scheduler, batch: Any, sampled: Any, **kwargs: Any) -> Any:
        counts = kwargs.get("num_sampled")
        emitted = iter([1] * len(batch.sampling_rows) if counts is None else counts.tolist())
        result = update(self, batch, sampled, **kwargs)
        for row in batch.sampling_rows:
            accepted = next(emitted) - 1
            req = row.request
            if row.num_drafts and not (req.admissions == row.admission and req.slot == row.slot):
                req.num_computed -= row.num_drafts - accepted
        return result

    patch.setattr(Scheduler, "update", rolling_back_lost_rows)


@mutant(
    "ASY-12/no-stall-detection",
    doc="The engine loop no longer reports its steps to the progress watchdog: a livelocked engine "
    "spins until an external timeout kills it.",
)
def no_stall_detection(patch: MutantPatch) -> None:
    from tokenstate.runtime.watchdog import ProgressWatchdog

    patch.setattr(ProgressWatchdog, "after_step", lambda self, unfinished, num_finished: None)


@mutant(
    "ASY-13/recurrent-drafts-not-rolled-back",
    doc="Recurrent layers checkpoint their state after each draft position but never restore it: "
    "the conv/SSM (Mamba2) and conv/delta-rule (KDA) state keeps the rejected drafts folded in.",
)
def recurrent_drafts_not_rolled_back(patch: MutantPatch) -> None:
    from tokenstate.models.draft_checkpoints import StateCheckpoints

    patch.setattr(StateCheckpoints, "restore", lambda self, plan, states: None)


@mutant(
    "ASY-14/drop-token-of-preempted",
    doc="A token resolved after its request was preempted is dropped instead of joining the output; "
    "a greedy or seeded resume recomputes it, so outputs alone cannot show the bug.",
)
def drop_token_of_preempted(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    emits = Scheduler._emits
    patch.setattr(Scheduler, "_emits", staticmethod(lambda req: emits(req) and req.slot >= 0))


@mutant(
    "ASY-16/readmit-with-token-in-flight",
    doc="Admission ignores a waiting request's in-flight tokens: a request preempted while its "
    "token was in flight is re-admitted in the same step, before that token resolved, and "
    "re-prefills without it (the late token then joins its output on top of the recomputed one).",
)
def readmit_with_token_in_flight(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    schedule, preempt = Scheduler.schedule, Scheduler.preempt
    hidden: list[tuple[Any, int]] = []  # (request, its in-flight count) hidden until schedule ends

    def hide(req: Any) -> None:
        hidden.append((req, req.num_inflight))
        req.num_inflight = 0

    def preempt_hiding_in_flight(self: Scheduler, req: Any) -> None:
        preempt(self, req)  # counts the preemption in flight and notes the lost slot first
        if req.num_inflight:
            hide(req)

    def schedule_ignoring_in_flight(self: Scheduler) -> Any:
        for req in [r for r in self.waiting if r.num_inflight]:
            hide(req)
        try:
            return schedule(self)
        finally:
            for req, count in hidden:
                req.num_inflight += count
            hidden.clear()

    patch.setattr(Scheduler, "preempt", preempt_hiding_in_flight)
    patch.setattr(Scheduler, "schedule", schedule_ignoring_in_flight)


gate_misses_record_into_lost_slot = mutant(
    "ASY-15/record-into-lost-slot",
    doc="ASY-8's bug seen from the gate: a late token recorded into the slot its request lost. The "
    "gate must catch it on every reference model, which takes a cell that hands a slot over while "
    "its previous owner's token is still in flight.",
)(record_into_lost_slot._apply)


@mutant(
    "ASY-19/penalties-read-host-table",
    doc="Repetition, presence and frequency penalties count the host's token table (placeholders "
    "read as token 0), looked at when the step's device work runs, instead of the device history; "
    "bad words keep the device history. Wrong exactly when the device runs before the host has "
    "recorded the previous step's token — always inline, rarely on the threaded stream.",
)
def penalties_read_host_table(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    model_runner = runner_module.ModelRunner
    apply, process = runner_module.apply_penalties, model_runner._process_logits
    running: list[Any] = []  # the runner whose logits are being processed

    def process_noting_runner(self: Any, *args: Any) -> torch.Tensor:
        running.append(self)
        try:
            return process(self, *args)
        finally:
            running.pop()

    def penalties_from_host_table(logits: torch.Tensor, history: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        table = torch.from_numpy(running[-1].table.ids).clamp(min=0).to(history.device)
        return apply(logits, table, *args, **kwargs)

    patch.setattr(model_runner, "_process_logits", process_noting_runner)
    patch.setattr(runner_module, "apply_penalties", penalties_from_host_table)


@mutant(
    "ASY-7/drafts-only-for-plain-greedy",
    doc="The scheduler proposes drafts only for greedy requests that read no history (the rule "
    "before drafts were verified by the sampled token): every request with a temperature, a "
    "penalty or bad words decodes one token per row.",
)
def drafts_only_for_plain_greedy(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    num_drafts = Scheduler._num_drafts

    def plain_greedy_only(self: Scheduler, req: Any, num_new: int, budget_left: int) -> int:
        if not req.params.greedy or req.params.reads_history:
            return 0
        return num_drafts(self, req, num_new, budget_left)

    patch.setattr(Scheduler, "_num_drafts", plain_greedy_only)


@mutant(
    "ASY-17/drafts-missing-from-history",
    doc="The runner leaves a step's drafts out of the device history until verification: the "
    "penalties and bad words of a draft position read what the history held there before (an "
    "earlier rejected draft, or nothing), not the drafts that precede it in the input.",
)
def drafts_missing_from_history(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    patch.setattr(ModelRunner, "_write_drafts_to_history", lambda self, dev: None)


@mutant(
    "ASY-18/bad-words-at-first-logit-only",
    doc="Bad words are matched only at each row's first logit, as when a row sampled one token: a "
    "drafted row's later logits may sample a banned token.",
)
def bad_words_at_first_logit_only(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    plan = runner_module.plan_bad_words

    def first_logits_only(entries: Any, **kwargs: Any) -> Any:
        entries = list(entries)
        firsts = {(slot, min(p for _, s, p, _ in entries if s == slot)) for _, slot, _, _ in entries}
        return plan([e for e in entries if (e[1], e[2]) in firsts], **kwargs)

    patch.setattr(runner_module, "plan_bad_words", first_logits_only)


@mutant(
    "ASY-20/slot-held-until-the-last-token-resolves",
    doc="A running request whose in-flight token can only finish it (a length limit) keeps its slot "
    "until the host resolves that token, so a waiting request is admitted one step later than on "
    "the sync path, and the async engine needs a step more for every such request.",
)
def slot_held_until_last_token_resolves(patch: MutantPatch) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    patch.setattr(Scheduler, "_release_finishing", lambda self: None)


@mutant(
    "ASY-21/stream-resets-host-draft-tracker",
    doc="The recurrent models' reset_slot — run on the stream, behind the host — also drops the "
    "slot's pending checkpoint from the host's draft tracker: where the stream runs late it drops "
    "the new owner's own checkpoint, recorded since, and the next row never rolls rejected drafts back.",
)
def stream_resets_host_draft_tracker(patch: MutantPatch) -> None:
    from tokenstate.models.kimi_linear import KimiLinear
    from tokenstate.models.nemotron_h import NemotronHBackbone

    for owner in (NemotronHBackbone, KimiLinear):
        reset = owner.reset_slot

        def reset_with_tracker(self, slot, _reset=reset):  # type: ignore[no-untyped-def]
            _reset(self, slot)
            self._drafts._pending.pop(slot, None)

        patch.setattr(owner, "reset_slot", reset_with_tracker)


@mutant(
    "ASY-22/gate-audit-waits-each-step",
    doc="The gate's engine audit waits for the stream after every step (it read the device state "
    "with a sync): the device is level with the host before each step is planned, so no async "
    "pipeline lag survives a step boundary and a stream task that clobbers host bookkeeping behind "
    "the host's back never runs behind it.",
)
def gate_audit_waits_each_step(patch: MutantPatch) -> None:
    from tokenstate.tools import gate_matrix
    from tokenstate.tools.step_audit import audit_engine

    patch.setattr(gate_matrix, "_audit", lambda llm: audit_engine(llm._engine, wait=True))
