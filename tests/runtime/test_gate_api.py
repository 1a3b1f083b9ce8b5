"""``tokenstate.testing.assert_async_equals_sync`` and the ``tokenstate_gate`` fixture."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokenstate.contracts import ConfigError, set_checks_mode
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import registry
from tokenstate.testing import assert_async_equals_sync
from tokenstate.tools.gate import GateReport

PLUGINS = Path(__file__).resolve().parents[1] / "tools" / "plugins"


@pytest.fixture
def broken_factory(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import broken_lm_plugin

    yield broken_lm_plugin.BROKEN
    registry.unregister(broken_lm_plugin.BROKEN)
    sys.modules.pop("broken_lm_plugin", None)


def test_a_correct_model_passes_and_returns_the_gate_report():
    report = assert_async_equals_sync(toy_factory(), num_requests=4, max_tokens=8)
    assert isinstance(report, GateReport) and report.passed
    assert report.totals()["async vs sync"] == (32, 32)
    assert report.stats["async"]["async_steps"] > 0


def test_the_fixture_is_the_same_function(tokenstate_gate):
    assert tokenstate_gate is assert_async_equals_sync


def test_a_silent_divergence_fails_naming_request_step_row_and_staleness(broken_factory):
    with pytest.raises(AssertionError) as exc:
        assert_async_equals_sync(broken_factory, [[1, 2, 3], [4, 5]], max_tokens=6)
    lines = str(exc.value).splitlines()
    assert lines[0] == "async scheduling diverged from sync scheduling for model 'BrokenLM':"
    assert any(
        line.startswith("  request ") and ", async vs sync: " in line and "first divergence token" in line
        and "(stale row)" in line
        for line in lines[1:]
    )


def test_a_contract_error_on_one_path_fails_with_its_message():
    with pytest.raises(AssertionError, match=r"the async path raised EmbeddedBadIdsError: "):
        assert_async_equals_sync(toy_factory(embed="private"), num_requests=2, max_tokens=4)
    with pytest.raises(AssertionError, match=r"the async path raised StaleHostTokensError: .*placeholder_buffer"):
        assert_async_equals_sync(toy_factory(embed="raw"), num_requests=2, max_tokens=4)


def test_an_own_engine_that_raises_on_one_path_fails_naming_that_path():
    def generate(prompts, async_scheduling):
        if async_scheduling:  # a plain nn.Embedding meeting a placeholder, say
            raise IndexError("index out of range in self")
        return [[7] for _ in prompts]

    with pytest.raises(AssertionError, match=r"the async path raised IndexError: index out of range in self") as exc:
        assert_async_equals_sync(generate, [[1]])
    assert isinstance(exc.value.__cause__, IndexError)


def test_own_engine_callable_divergence_names_the_token():
    def generate(prompts, async_scheduling):
        return [[7, 8, 9] if not async_scheduling or i else [7, 1, 9] for i, _ in enumerate(prompts)]

    with pytest.raises(AssertionError) as exc:
        assert_async_equals_sync(generate, [[1], [2]])
    assert str(exc.value) == (
        "async scheduling diverged from sync scheduling:\n"
        "  request 0 (1-token prompt): 1/3 tokens match; first divergence token 1: expected 8, got 1"
    )
    assert assert_async_equals_sync(lambda prompts, a: [[1]] * len(prompts), [[3]]) == {"sync": [[1]], "async": [[1]]}


def test_bad_arguments_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match=r"pass prompts=\[\[\.\.\.\], \.\.\.\] with your own engine's generate"):
        assert_async_equals_sync(lambda prompts, a: prompts)
    with pytest.raises(ConfigError, match=r"must return one token-id list per prompt \(1\)"):
        assert_async_equals_sync(lambda prompts, a: [], [[1]])
    with pytest.raises(ConfigError, match=r"checks='loud' is not a checks mode; valid values: off, boundary, full"):
        assert_async_equals_sync(toy_factory(), checks="loud")
    with pytest.raises(ConfigError, match=r"prompts must be a non-empty list of token-id lists"):
        assert_async_equals_sync(toy_factory(), "hello")
    monkeypatch.setenv("TOKENSTATE_CHECKS", "bogus")
    set_checks_mode(None)
    with pytest.raises(ConfigError, match=r"TOKENSTATE_CHECKS='bogus' is not a checks mode"):
        assert_async_equals_sync(toy_factory())


@pytest.mark.parametrize("prompts", [[[]], [[-1]], [[10**9]], [["a"]], [[1.5]]])
def test_a_bad_prompt_is_the_callers_config_error_not_a_divergence(prompts):
    with pytest.raises(ConfigError, match=r"prompt 0"):
        assert_async_equals_sync(toy_factory(), prompts, max_tokens=2)


@pytest.mark.parametrize("returned", [[5, 6], [["a"], ["b"]], [None, None], [[1.5], [2]]])
def test_own_engine_outputs_that_are_not_token_id_lists_are_config_errors(returned):
    with pytest.raises(ConfigError, match=r"must return one token-id list per prompt"):
        assert_async_equals_sync(lambda prompts, a: returned, [[1], [2]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checks": "full"}, r"checks=.* configure tokenstate's own engines"),
        ({"oracle": True}, r"oracle=.* configure tokenstate's own engines"),
        ({"max_tokens": 4}, r"max_tokens=.* configure tokenstate's own engines"),
        ({"device": "tpu"}, r"device=.* configure tokenstate's own engines"),
    ],
)
def test_own_engine_refuses_the_options_it_would_ignore(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        assert_async_equals_sync(lambda prompts, a: prompts, [[1], [2]], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"oracle": "yes"}, "oracle must be a bool"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"max_tokens": "x"}, "max_tokens must be a positive int"),
        ({"num_requests": 0}, "num_requests must be a positive int"),
        ({"num_requests": 10**11}, r"num_requests must be at most 100000"),
    ],
)
def test_registered_model_options_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        assert_async_equals_sync(toy_factory(), **kwargs)


def test_an_own_engine_whose_reference_path_fails_compared_nothing():
    def generate(prompts, async_scheduling):
        raise RuntimeError("out of memory")

    with pytest.raises(AssertionError, match=r"the sync path, the reference, raised RuntimeError: out of memory; nothing was compared") as exc:
        assert_async_equals_sync(generate, [[1]])
    assert "diverged" not in str(exc.value)


def test_an_own_engine_generate_that_cannot_take_prompts_and_the_flag_positionally_is_refused():
    def generate(prompts, *, async_scheduling):
        return [[1] for _ in prompts]

    with pytest.raises(ConfigError, match=r"generate\(prompts, async_scheduling\) is called with two positional"):
        assert_async_equals_sync(generate, [[1]])


def test_an_own_engine_that_generates_no_token_compared_nothing():
    with pytest.raises(ConfigError, match=r"generated no token for any prompt.*nothing to compare"):
        assert_async_equals_sync(lambda prompts, a: [[] for _ in prompts], [[1], [2]])
