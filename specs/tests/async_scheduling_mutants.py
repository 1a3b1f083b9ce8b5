"""Mutants of the async-scheduling spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from tokenstate.contracts.ledger import MutantPatch, mutant


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

    def by_row(self: ModelRunner, batch: Any, dev: Any) -> Any:
        rows = original(self, batch, dev)
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
