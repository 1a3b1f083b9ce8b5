"""The static verdict and the runtime agree: each runnable zoo forward, run by the async engine.

Every forward of the runnable zoo modules is registered as *honouring* device ids — the claim the
checker judges — and run through ``LLM(async_scheduling=True)`` on the CPU mirror, where decode
steps have spliced rows and the host buffer holds placeholders:

* a forward the checker passes (``honors``/``inert``) never raises and produces exactly the tokens
  of the synchronous engine, on the device path (no fallback step);
* a forward the checker flags (``ignores``) fails there: ``StaleHostTokensError``, the guarded
  embedding refusing a placeholder, or — for the raw buffer, which does not raise by itself — a
  read of ``placeholder_buffer()`` inside the forward on a step with stale positions (a test hook,
  below); the same forward on the synchronous engine runs, so the failure is the spliced rows'.

``unknown`` forwards are never passed by the checker, so there is no verdict to agree with; they
are not run (compiling on a CPU runner would only slow the suite).
"""

from __future__ import annotations

import contextvars
import importlib
import sys
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from torch import Tensor

from tokenstate.contracts import ContractViolation, ForwardInput, HostTokens, entry_point
from tokenstate.contracts.checker import Verdict

from .conftest import _EXPECTED_MODULE, EXPECTED, ZOO_ROOT

PROMPTS = [[1, 5, 9, 3], [2, 7], [11, 4, 6, 8, 10, 12]]  # ids inside the servable vocabulary (40)
RUNNABLE = sorted(
    entry for entry, (verdict, _) in EXPECTED.items()
    if entry.rpartition(".")[0] in _EXPECTED_MODULE.RUNNABLE_MODULES and verdict is not Verdict.UNKNOWN
)

_IN_FORWARD: contextvars.ContextVar[ForwardInput | None] = contextvars.ContextVar("zoo_forward", default=None)


class PlaceholderComputed(Exception):
    """A forward read the raw host buffer on a step whose buffer holds placeholders."""


@pytest.fixture(scope="module")
def zoo_modules() -> Iterator[None]:
    """The zoo on ``sys.path`` for this module only (the checker tests read it, never import it)."""
    sys.path.insert(0, str(ZOO_ROOT))
    try:
        yield
    finally:
        sys.path.remove(str(ZOO_ROOT))
        for name in [n for n in sys.modules if n == "czoo" or n.startswith("czoo.")]:
            del sys.modules[name]


@pytest.fixture
def watch_placeholder_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    original = HostTokens.placeholder_buffer

    def placeholder_buffer(self: HostTokens) -> Tensor:
        if _IN_FORWARD.get() is not None and self.has_stale:  # the runtime's own combine reads it too
            raise PlaceholderComputed(f"the forward read the raw host buffer at stale rows {list(self.stale_rows)}")
        return original(self)

    monkeypatch.setattr(HostTokens, "placeholder_buffer", placeholder_buffer)


def factory_for(entry: str) -> Any:
    from tokenstate.runtime import ModelFactory

    module_name, _, forward_name = entry.rpartition(".")
    forward = getattr(importlib.import_module(module_name), forward_name)
    build_at = _EXPECTED_MODULE.BUILD_FUNCTIONS.get((module_name, forward_name))
    if build_at is not None:
        build = getattr(importlib.import_module(build_at[0]), build_at[1])
    else:  # what the checker analyses: an instance of the annotated class
        model_class = typing.get_type_hints(forward.__wrapped__)["model"]

        def build(config: dict, *, device: Any, seed: int) -> Any:
            return model_class(config).to(device)

    @entry_point(name=f"observed.{entry}")
    def observed(model: Any, inp: ForwardInput) -> Tensor:
        token = _IN_FORWARD.set(inp)
        try:
            return forward(model, inp)
        finally:
            _IN_FORWARD.reset(token)

    name = "Zoo" + forward_name.title().replace("_", "")
    return ModelFactory(
        architectures=(name,), forward=observed, build=build, honors_device_token_ids=True,
        presets={name.lower(): {}},
    )


def generate(entry: str, *, async_scheduling: bool) -> tuple[list[list[int]], Any]:
    from tokenstate.runtime import LLM, SamplingParams

    llm = LLM(factory_for(entry), async_scheduling=async_scheduling, max_num_seqs=4)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True))
    return [list(o.token_ids) for o in outputs], llm.stats


def test_every_verdict_kind_that_can_agree_is_run() -> None:
    verdicts = {EXPECTED[e][0] for e in RUNNABLE}
    assert verdicts == {Verdict.HONORS, Verdict.IGNORES} and len(RUNNABLE) >= 30


@pytest.mark.parametrize("entry", RUNNABLE)
@pytest.mark.usefixtures("zoo_modules", "watch_placeholder_reads")
def test_static_verdict_and_async_runtime_agree(entry: str, zoo_report) -> None:
    verdict = zoo_report.by_entry()[entry].verdict
    assert verdict is EXPECTED[entry][0]
    sync_tokens, _ = generate(entry, async_scheduling=False)
    if verdict is Verdict.IGNORES:
        with pytest.raises((ContractViolation, PlaceholderComputed)):
            generate(entry, async_scheduling=True)
        return
    async_tokens, stats = generate(entry, async_scheduling=True)
    assert async_tokens == sync_tokens and all(len(t) == 5 for t in async_tokens)
    assert stats.async_steps > 0 and stats.fallback_steps == 0
