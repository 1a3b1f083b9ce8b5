"""The library-use example runs in CI: the right forward works, the buggy one is caught."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from my_engine import engine, model

from tokenstate.contracts import StaleHostTokensError

PROMPTS = [[3, 9, 12], [7, 1], [40, 41, 42, 43, 5]]


def _reference(prompts, max_tokens):
    """Plain greedy decoding without any async splice: the tokens the engine must reproduce."""
    import torch

    lm = model.TinyRecurrentLM()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            h = torch.zeros(lm.mix.shape[0])
            tokens = list(prompt)
            generated = []
            for t in range(len(prompt) + max_tokens - 1):
                h = torch.tanh(lm.embed[tokens[t]] + h @ lm.mix)
                if t >= len(prompt) - 1:
                    nxt = int((h @ lm.head).argmax())
                    generated.append(nxt)
                    tokens.append(nxt)
            out.append(generated)
    return out


def test_engine_with_contract_checked_forward_matches_plain_decoding():
    import torch

    with torch.no_grad():
        got = engine.generate(model.forward, model.TinyRecurrentLM(), PROMPTS, max_tokens=6)
    assert got == _reference(PROMPTS, 6)


def test_engine_catches_a_forward_that_embeds_stale_host_ids():
    import torch

    with torch.no_grad(), pytest.raises(StaleHostTokensError, match=r"rows \[0, 1, 2\]"):
        engine.generate(model.forward_reads_host, model.TinyRecurrentLM(), PROMPTS, max_tokens=6)


def test_routing_checker_flags_the_buggy_forward_statically():
    from tokenstate.checker import EntryTarget, check_entry_points

    report = check_entry_points(
        [
            EntryTarget("good", "my_engine.model", "forward", declared=True),
            EntryTarget("bad", "my_engine.model", "forward_reads_host", declared=True),
        ]
    )
    verdicts = {r.entry: r.verdict.value for r in report.results}
    assert verdicts == {"good": "honors", "bad": "ignores"}
    assert [f.entry for f in report.findings] == ["bad"]
    assert "my_engine/model.py" in report.render()


def _generate_with(forward):
    """The engine as ``assert_async_equals_sync`` calls it: ``generate(prompts, async_scheduling)``."""
    import torch

    def generate(prompts, async_scheduling):
        with torch.no_grad():
            return engine.generate(forward, model.TinyRecurrentLM(), prompts, 6, async_scheduling=async_scheduling)

    return generate


def test_async_scheduling_reproduces_sync_scheduling():
    from tokenstate.testing import assert_async_equals_sync

    outputs = assert_async_equals_sync(_generate_with(model.forward), PROMPTS)
    assert outputs["async"] == outputs["sync"] == _reference(PROMPTS, 6)


def test_the_gate_fixture_fails_the_forward_that_embeds_stale_host_ids(tokenstate_gate):
    with pytest.raises(AssertionError, match=r"the async path raised StaleHostTokensError: .*rows \[0, 1, 2\]"):
        tokenstate_gate(_generate_with(model.forward_reads_host), PROMPTS)
