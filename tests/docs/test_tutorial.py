"""Runs every step of the tutorial (docs/tutorial/), exactly the code its page shows."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tokenstate.contracts import ConfigError, ContractViolation, StaleHostTokensError
from tokenstate.runtime import resolve

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial"
CODE = TUTORIAL / "tiny_recurrent_lm.py"
PAGE = TUTORIAL / "index.md"


@pytest.fixture(scope="module")
def tutorial() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("tokenstate_docs_tutorial", CODE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and beartype resolve annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def sync_tokens(tutorial: ModuleType) -> list[tuple[int, ...]]:
    tokens, stats = tutorial.generate(tutorial.naive, async_scheduling=False)
    assert stats.sync_steps > 0 and stats.async_steps == stats.fallback_steps == 0
    assert all(len(t) == tutorial.GREEDY.max_tokens for t in tokens)
    return tokens


def test_page_shows_every_section_and_only_sections_that_exist() -> None:
    sections = set(re.findall(r"--8<-- \[start:(\w+)\]", CODE.read_text()))
    included = re.findall(r'--8<-- "tutorial/tiny_recurrent_lm\.py:(\w+)"', PAGE.read_text())
    assert sections, "the tutorial code has no snippet sections"
    assert set(included) == sections, f"shown {sorted(included)} vs written {sorted(sections)}"


def test_step2_host_id_forward_falls_back_and_stays_correct(
    tutorial: ModuleType, sync_tokens: list[tuple[int, ...]]
) -> None:
    tokens, stats = tutorial.generate(tutorial.naive, async_scheduling=True)
    assert tokens == sync_tokens
    assert stats.fallback_steps > 0, "decode steps of a forward that did not opt in must fall back"
    stats = tutorial.compare_paths(tutorial.naive)  # the page's own comparison, and its comment
    assert (stats.async_steps, stats.fallback_steps) == (1, 7)


def test_step2_refuse_policy_names_the_model(tutorial: ModuleType) -> None:
    with pytest.raises(ContractViolation, match=r"'TinyRecurrentLM'.*honors_device_token_ids=True"):
        tutorial.compare_paths(tutorial.naive, on_unhonored="refuse")


def test_step3_false_promise_is_refused_on_the_first_async_decode(tutorial: ModuleType) -> None:
    with pytest.raises(
        StaleHostTokensError, match=r"stale host token ids read at rows \[0, 1, 2\]"
    ):
        tutorial.generate(tutorial.lying, async_scheduling=True)


def test_step4_honouring_forward_takes_the_device_path(
    tutorial: ModuleType, sync_tokens: list[tuple[int, ...]]
) -> None:
    tokens, stats = tutorial.generate(tutorial.honouring, async_scheduling=True)
    assert tokens == sync_tokens
    assert stats.fallback_steps == 0 and stats.async_steps > 0


def test_step5_registered_by_name_and_unregistered_after(
    tutorial: ModuleType, sync_tokens: list[tuple[int, ...]]
) -> None:
    assert tutorial.generate_by_name() == sync_tokens
    with pytest.raises(ConfigError):
        resolve("tiny-recurrent")


def test_the_checked_pytest_snippet_gates_the_tutorials_model_as_written(tutorial: ModuleType) -> None:
    """docs/how-to/checked-pytest.md's one-line gate, on a model with a 64-token context: the
    schedule matrix fits its requests into the context rather than refusing the user's 16 tokens."""
    import dataclasses

    from tokenstate.runtime import register, unregister
    from tokenstate.testing import assert_async_equals_sync

    mine = dataclasses.replace(tutorial.honouring, presets={"tiny-mine": tutorial.CONFIG})
    register(mine)
    try:
        assert_async_equals_sync("tiny-mine", max_tokens=16)
    finally:
        unregister(mine)
