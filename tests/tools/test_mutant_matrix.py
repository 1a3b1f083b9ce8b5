"""The mutant matrix (``scripts/mutant_matrix.py``) still mutates the code it targets.

A mutant written against an older signature does not model its bug any more: it crashes the engine
with a ``TypeError`` at its own call, and the matrix counts the crash as a catch. Five of its
mutants had rotted that way (``post_update``'s and ``DeviceMirror.upload``'s later keywords, a
proposer note taken on the host while the proposer runs on the stream). This runs every mutant on
each reference model, on the gate's threaded stream, and refuses any error raised by a mutant's own
code instead of by the code it mutates.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from tokenstate.runtime import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_MODELS = ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear")
PROMPTS = [[5, 6, 7, 8], [9, 3, 4], [11, 12, 13, 14, 15, 16], [2, 8, 8, 8, 8]]
# Every kind of request the mutants concern: greedy, penalised, bad words, seeded sampling.
PARAMS = [
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=6, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.4),
    SamplingParams(max_tokens=6, ignore_eos=True, bad_words=[[13]]),
    SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, top_k=8, seed=3),
]


def _matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutant_matrix", ROOT / "scripts" / "mutant_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutant_matrix"] = module  # the dataclasses in it look their module up
    spec.loader.exec_module(module)
    return module


def _raised_by_the_mutant(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a mutant's own code (its wrapper), not from the code it mutates."""
    innermost = traceback.extract_tb(exc.__traceback__)[-1].filename
    if innermost.endswith(("mutant_matrix.py", "_mutants.py")):
        return True
    # A wrapper called with arguments its signature no longer takes fails at the call site.
    return isinstance(exc, TypeError) and "argument" in str(exc)


def _run(model: str, **engine: object) -> None:
    llm = LLM(model, async_scheduling=True, max_num_seqs=3, max_num_batched_tokens=16, cpu_stream="thread", **engine)
    llm.generate(PROMPTS, PARAMS)


def test_every_mutant_runs_the_code_it_mutates() -> None:
    matrix = _matrix()
    rotted = []
    for name in matrix.MUTANTS:
        patch = matrix.apply_mutant(name)
        try:
            for model in REFERENCE_MODELS:
                for engine in ({}, {"speculative": {"method": "ngram", "num_tokens": 2}}):
                    try:
                        _run(model, **engine)
                    except Exception as exc:  # a crash of the mutated code is the mutant working
                        if _raised_by_the_mutant(exc):
                            rotted.append(f"{name} on {model} {engine}: {type(exc).__name__}: {exc}")
        finally:
            patch.undo()
    assert not rotted, "\n".join(rotted)
