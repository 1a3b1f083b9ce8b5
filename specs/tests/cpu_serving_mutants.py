"""Mutants of the cpu-serving spec: each reverts exactly one fix a paid item depends on."""

from __future__ import annotations

from typing import Any

from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "CPU-1/packed-cache-never-revalidated",
    doc="FusedProjection keeps its packed copy once built: a weight written in place, replaced or "
    "reloaded afterwards is never seen, and the projection computes with the old weights.",
)
def packed_cache_never_revalidated(patch: MutantPatch) -> None:
    from tokenstate.models.fused_linear import FusedProjection

    def cached(self: FusedProjection, linears: Any) -> bool:
        return self._weight is not None or self._packed is not None

    patch.setattr(FusedProjection, "_is_current", cached)


@mutant(
    "CPU-2/gathers-the-caches",
    doc="The decode attention gathers the running slots' caches into a fresh tensor every step "
    "(index_select over the slots), as before attention read the caches in place.",
)
def gathers_the_caches(patch: MutantPatch) -> None:
    from tokenstate.models import layers

    attend = layers._attend_short_rows

    def gathering(q: Any, k_cache: Any, v_cache: Any, short: Any, scale: float, dv: int) -> Any:
        import torch

        everything = torch.arange(k_cache.shape[0], device=k_cache.device)  # [num_slots]
        return attend(q, k_cache.index_select(0, everything), v_cache.index_select(0, everything), short, scale, dv)

    patch.setattr(layers, "_attend_short_rows", gathering)


@mutant(
    "CPU-5/compiled-stack-never-rechecks-weights",
    doc="A compiled decoder stack reads the transposed weight copies it found at compilation: the "
    "projections' weights are not re-checked before each compiled call, so a weight written in "
    "place, replaced or reloaded afterwards is never seen.",
)
def compiled_stack_never_rechecks_weights(patch: MutantPatch) -> None:
    from tokenstate.models.dense import DenseModel

    compile_layers = DenseModel.compile_layers

    def without_recheck(self: DenseModel) -> None:
        compile_layers(self)
        self._projections = []

    patch.setattr(DenseModel, "compile_layers", without_recheck)


@mutant(
    "CPU-6/caches-backed-at-first-write",
    doc="The engine does not fault its model's KV caches in when it starts: each slot's pages are "
    "backed by the kernel when a step first writes them, so the first requests pay the page faults.",
)
def caches_backed_at_first_write(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    patch.setattr(ModelRunner, "_fault_in_slot_state", lambda self: None)
