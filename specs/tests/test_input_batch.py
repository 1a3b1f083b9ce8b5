"""Items of specs/input-batch.md: one input batch per step, uploaded once."""

from __future__ import annotations

import sys
import threading
from collections import Counter

import pytest
import torch
import torch.utils._device

from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.runner import ModelRunner

from .input_batch_mutants import drafts_planned_in_forward, forward_uploads_own_indices

PRESETS = ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear")
BUILDERS = ("tensor", "as_tensor", "from_numpy")  # how host row metadata becomes a tensor
PROMPTS = [[5, 6, 7, 8], [9, 3], list(range(10, 30))]
REPEATING = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 3, 9, 3, 9], [*range(10, 20), *range(10, 20)]]  # drafts hit


def count_builders(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count tensor-building calls that model code makes inside the runner's device steps."""
    # torch.device(...) contexts recognise constructors through a set that torch builds once and
    # caches (torch.utils._device._device_constructors). Built while torch.tensor is patched, the
    # set holds the counting wrapper instead of torch.tensor for the rest of the process, so later
    # device contexts (model construction, the HF oracle's loading) stop placing torch.tensor's
    # results: that is what once changed the HF oracle's tokens in later tests. Build it first.
    torch.utils._device._device_constructors()
    inside = threading.local()
    built: Counter = Counter()
    for name in BUILDERS:
        original = getattr(torch, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if getattr(inside, "device_step", False) and caller.startswith("tokenstate.models"):
                built[f"{caller}: torch.{_name}"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, counting)
    device_step = ModelRunner._device_step

    def device_step_counted(self: ModelRunner, *args: object) -> None:
        inside.device_step = True
        try:
            device_step(self, *args)
        finally:
            inside.device_step = False

    monkeypatch.setattr(ModelRunner, "_device_step", device_step_counted)
    return built


def _count(monkeypatch: pytest.MonkeyPatch, *, speculative: bool = False) -> dict[str, int]:
    import tokenstate.models  # noqa: F401 - registers the reference models

    built = count_builders(monkeypatch)
    spec = {"method": "ngram", "num_tokens": 2} if speculative else None
    for preset in PRESETS:
        LLM(preset, max_num_seqs=3, max_num_batched_tokens=16, speculative=spec).generate(
            REPEATING if speculative else PROMPTS, SamplingParams(max_tokens=8 if speculative else 4)
        )
    return dict(built)


@pytest.mark.paid("INB-1", before=forward_uploads_own_indices)
def test_forwards_build_no_row_metadata_of_their_own(monkeypatch):
    built = _count(monkeypatch)
    assert not built, f"forwards built row metadata themselves: {built}"


@pytest.mark.paid("INB-2", before=drafts_planned_in_forward)
def test_draft_rollback_indices_arrive_in_the_layout(monkeypatch):
    built = _count(monkeypatch, speculative=True)
    assert not built, f"forwards built row metadata themselves under speculative decoding: {built}"
