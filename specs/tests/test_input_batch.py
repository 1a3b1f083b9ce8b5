"""Items of specs/input-batch.md: one input batch per step, uploaded once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .input_batch_mutants import InChild, forward_uploads_own_indices


def _count_in_child(*flags: str) -> dict[str, int]:
    # In a child process: patching torch's tensor builders while an engine is built was seen to
    # change what later tests in the same process compute (the HF oracle's tiny-llama tokens), so
    # the counting never shares a process with other tests. A mutant applied here is applied in
    # the child too (it names itself in InChild).
    child = Path(__file__).with_name("_input_batch_child.py")
    argv = [sys.executable, str(child), *flags, *([InChild.name] if InChild.name else [])]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.paid("INB-1", before=forward_uploads_own_indices)
def test_forwards_build_no_row_metadata_of_their_own():
    built = _count_in_child()
    assert not built, f"forwards built row metadata themselves: {built}"


@pytest.mark.owed("INB-2")
def test_draft_rollback_indices_arrive_in_the_layout():
    built = _count_in_child("--speculative")
    assert not built, f"forwards built row metadata themselves under speculative decoding: {built}"
