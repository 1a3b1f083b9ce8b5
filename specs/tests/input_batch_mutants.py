"""Mutants of the input-batch spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

from tokenstate.contracts import BatchLayout, ForwardInput, IndexPlan
from tokenstate.ledger import MutantPatch, mutant
from tokenstate.models import draft_checkpoints
from tokenstate.models.draft_checkpoints import DraftPlan, DraftTracker, bind_draft_plan
from tokenstate.models.step_plan import PlanPart, upload_part
from tokenstate.runtime.runner import ModelRunner


def _plan_nothing(self: ModelRunner, layout: BatchLayout) -> IndexPlan | None:
    return None


@mutant(
    "INB-1/forward-uploads-own-indices",
    doc="The runner plans no model indices, so the step's layout carries none and every reference "
    "forward builds its index tensors from the host rows and uploads them itself (the behaviour "
    "before one input batch per step).",
)
def forward_uploads_own_indices(patch: MutantPatch) -> None:
    patch.setattr(ModelRunner, "_plan_indices", _plan_nothing)



_HOST_PLAN_PART = DraftTracker.plan_part


def _host_plans_no_drafts(self: DraftTracker, layout: BatchLayout) -> PlanPart:
    return PlanPart(draft_checkpoints._DraftMeta(restores=False, lengths=()), ())


def _plan_drafts_in_forward(self: DraftTracker, inp: ForwardInput) -> DraftPlan:
    part = _HOST_PLAN_PART(self, inp.layout)  # the host's bookkeeping, done inside the forward
    return bind_draft_plan(part.meta, upload_part(part.arrays, inp.device))  # and its own upload


@mutant(
    "INB-2/drafts-planned-in-forward",
    doc="The draft rollback is planned inside the forward, as before: the host sends an empty "
    "drafts part and each recurrent forward builds and uploads the restore and draft-row indices "
    "itself.",
)
def drafts_planned_in_forward(patch: MutantPatch) -> None:
    patch.setattr(DraftTracker, "plan_part", _host_plans_no_drafts)
    patch.setattr(DraftTracker, "plan", _plan_drafts_in_forward)
