"""Mutants of the input-batch spec: each reverts exactly one fix a paid item depends on.

INB-1's test counts in a child process, so a mutant also names itself in :class:`InChild`: the
test hands that name to the child, which applies the same mutant there.
"""

from __future__ import annotations

from tokenstate.contracts import BatchLayout, IndexPlan
from tokenstate.ledger import MutantPatch, mutant
from tokenstate.runtime.runner import ModelRunner


class InChild:
    """The mutant applied now, which INB-1's child process must apply too (``None``: none)."""

    name: str | None = None


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
    patch.setattr(InChild, "name", "INB-1/forward-uploads-own-indices")


MUTANTS = {m.name: m for m in (forward_uploads_own_indices,)}
