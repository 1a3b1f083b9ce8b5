"""The reference models' per-step index plans: built on the host, uploaded once by the runtime.

A model's factory declares ``plan_indices``: the runner calls it on the host with the step's
:class:`~tokenstate.contracts.BatchLayout`, uploads the plan's arrays in the step's one int64
staging copy and hands them to the forward as ``inp.layout.indices``. Each consumer of a model
(the attention's :class:`~tokenstate.models.slot_batch.SlotBatch`, a recurrent layer's row split)
owns one named :class:`PlanPart` of it and reads it back with :func:`part_tensors`.

A forward called without the runtime (a unit test, an HF parity check feeding a hand-built
``ForwardInput``) finds no indices in the layout and uploads its part itself (:func:`upload_part`):
the same numbers, in one pinned, non-blocking copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tokenstate.contracts import BatchLayout, ContractViolation, ForwardInput, IndexPlan

__all__ = ["PlanPart", "index_plan", "part_tensors", "plan_model_indices", "upload_part"]


@dataclass(frozen=True, slots=True)
class PlanPart:
    """One consumer's share of a step's index plan: host-only facts and int64 arrays to upload."""

    meta: object
    arrays: tuple[np.ndarray, ...]  # each 1-D int64


@dataclass(frozen=True, slots=True)
class _PartSpans:
    """An :class:`IndexPlan`'s meta: which arrays belong to which named part."""

    spans: dict[str, tuple[object, int, int]]  # name -> (part meta, first array, one past the last)


def index_plan(**parts: PlanPart | None) -> IndexPlan:
    """Pack named parts (``None`` ones left out) into the one plan the runtime uploads."""
    spans: dict[str, tuple[object, int, int]] = {}
    arrays: list[np.ndarray] = []
    for name, part in parts.items():
        if part is not None:
            spans[name] = (part.meta, len(arrays), len(arrays) + len(part.arrays))
            arrays.extend(part.arrays)
    return IndexPlan(tuple(arrays), _PartSpans(spans))


def part_tensors(inp: ForwardInput, name: str) -> tuple[object, tuple[Tensor, ...]] | None:
    """Part ``name`` of the step's uploaded plan as ``(meta, device tensors)``; ``None`` when the
    layout carries no plan (a forward called without the runtime)."""
    indices = inp.layout.indices
    if indices is None:
        return None
    spans = indices.meta
    if not isinstance(spans, _PartSpans) or name not in spans.spans:
        raise ContractViolation(
            f"the step's layout carries an index plan without a {name!r} part; plan the step with "
            "the model's own plan_indices (its ModelFactory's), which builds every part it reads."
        )
    meta, first, end = spans.spans[name]
    return meta, indices.tensors[first:end]


def upload_part(arrays: tuple[np.ndarray, ...], device: torch.device) -> tuple[Tensor, ...]:
    """The fallback without the runtime: a part's arrays in one copy (pinned, non-blocking)."""
    sizes = [a.shape[0] for a in arrays]
    if not sizes:
        return ()
    packed = torch.from_numpy(np.concatenate(arrays))  # [sum(sizes)] int64
    if device.type != "cpu":
        packed = packed.pin_memory().to(device, non_blocking=True)
    return tuple(packed.split(sizes))


def plan_model_indices(model: object, layout: BatchLayout) -> IndexPlan:
    """The ``plan_indices`` hook of the reference factories: the model's own ``plan_indices``."""
    return model.plan_indices(layout)  # type: ignore[attr-defined]
