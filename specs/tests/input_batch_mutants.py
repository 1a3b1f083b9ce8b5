"""Mutants of the input-batch spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

from tokenstate.contracts import BatchLayout, IndexPlan
from tokenstate.ledger import MutantPatch, mutant
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

