"""INB's counting, run in a child process (``python _input_batch_child.py [--speculative] [MUTANT]``).

Counts the tensor-building calls (``torch.tensor`` / ``as_tensor`` / ``from_numpy``) that model
code makes inside the runner's device steps of the three reference presets (with n-gram
speculative decoding when ``--speculative``), with the named mutant of ``input_batch_mutants.py``
applied when one is given, and prints the counts as JSON.
"""

from __future__ import annotations

import contextlib
import json
import runpy
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.runner import ModelRunner

PRESETS = ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear")
BUILDERS = ("tensor", "as_tensor", "from_numpy")  # how host row metadata becomes a tensor
PROMPTS = [[5, 6, 7, 8], [9, 3], list(range(10, 30))]
REPEATING = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 3, 9, 3, 9], [*range(10, 20), *range(10, 20)]]  # drafts hit


def count_builders(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count tensor-building calls that model code makes inside the runner's device steps."""
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


def count(mutant: str | None = None, *, speculative: bool = False) -> dict[str, int]:
    """Run the three reference presets with the builders counted (under ``mutant`` if named)."""
    import tokenstate.models  # noqa: F401 - registers the reference models

    applied = contextlib.nullcontext()
    if mutant is not None:
        mutants = runpy.run_path(str(Path(__file__).with_name("input_batch_mutants.py")))
        applied = mutants["MUTANTS"][mutant].applied()
    monkeypatch = pytest.MonkeyPatch()
    with applied:
        try:
            built = count_builders(monkeypatch)
            spec = {"method": "ngram", "num_tokens": 2} if speculative else None
            for preset in PRESETS:
                LLM(preset, max_num_seqs=3, max_num_batched_tokens=16, speculative=spec).generate(
                    REPEATING if speculative else PROMPTS, SamplingParams(max_tokens=8 if speculative else 4)
                )
            return dict(built)
        finally:
            monkeypatch.undo()


if __name__ == "__main__":
    args = sys.argv[1:]
    speculative = "--speculative" in args
    names = [a for a in args if a != "--speculative"]
    print(json.dumps(count(names[0] if names else None, speculative=speculative)))
