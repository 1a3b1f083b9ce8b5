"""Items of specs/input-batch.md: one input batch per step, uploaded once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter

import pytest
import torch

from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.runner import ModelRunner

PRESETS = ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear")
BUILDERS = ("tensor", "as_tensor", "from_numpy")  # how host row metadata becomes a tensor
PROMPTS = [[5, 6, 7, 8], [9, 3], list(range(10, 30))]


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


def _count_in_this_process() -> dict[str, int]:
    """Run the three reference presets with the builders counted; return the counts."""
    import tokenstate.models  # noqa: F401 - registers the reference models

    monkeypatch = pytest.MonkeyPatch()
    try:
        built = count_builders(monkeypatch)
        for preset in PRESETS:
            LLM(preset, max_num_seqs=3, max_num_batched_tokens=16).generate(
                PROMPTS, SamplingParams(max_tokens=4)
            )
        return dict(built)
    finally:
        monkeypatch.undo()


@pytest.mark.owed("INB-1")
def test_forwards_build_no_row_metadata_of_their_own():
    # In a child process: patching torch's tensor builders while an engine is built was seen to
    # change what later tests in the same process compute (the HF oracle's tiny-llama tokens), so
    # the counting never shares a process with other tests.
    code = (
        "import json, runpy, sys; "
        f"mod = runpy.run_path({__file__!r}); "
        "print(json.dumps(mod['_count_in_this_process']()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    assert not built, f"forwards built row metadata themselves: {built}"
