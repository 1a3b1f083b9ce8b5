"""The original bug, reproduced and prevented on the CPU.

A forward that embeds the host ids while declaring honors_device_token_ids=True is stopped by the
type state on the first async decode step; declaring False makes the runner fall back (tokens stay
right); on_unhonored="refuse" names the model; a forward that bypasses the type state and embeds the
raw placeholder buffer is stopped by the guarded embedding. No placeholder ever reaches an output.
"""

from __future__ import annotations

import pytest

from tokenstate.contracts import PLACEHOLDER, ContractViolation, StaleHostTokensError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.kernels import EmbeddedBadIdsError

PROMPTS = [[4, 8, 15, 16, 23, 42], [1, 2, 3], [99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89]]
SAMPLING = SamplingParams(max_tokens=8)


def reference() -> list[tuple[int, ...]]:
    out = LLM(toy_factory(), async_scheduling=False).generate(PROMPTS, SAMPLING)
    return [o.token_ids for o in out]


def test_host_ids_with_honors_true_raise_on_the_first_async_decode_step():
    llm = LLM(toy_factory(embed="host", honors=True), max_num_batched_tokens=64)
    # Admitted together, the three requests take slots 0-2 in order of prompt length (6, 3, 11 ids);
    # decode rows stand in slot order.
    with pytest.raises(
        StaleHostTokensError,
        match=r"stale host token ids read at rows \[0, 1, 2\] \(slots \[0, 1, 2\]\)",
    ) as caught:
        llm.generate(PROMPTS, SAMPLING)
    assert caught.value.rows == (0, 1, 2) and caught.value.slots == (0, 1, 2)
    # The prefill step, the first decode step and the next were launched: the first decode step's
    # forward raised on the stream, and the error surfaced at its sync point (resolved after the
    # next step's launch), before any of its tokens reached the host.
    assert llm.stats.async_steps == 3
    # The engine is usable again: a prefill-only request never has a stale row.
    assert llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1))[0].token_ids == (
        reference()[0][0],
    )


def test_the_same_bug_is_invisible_without_async_scheduling():
    out = LLM(toy_factory(embed="host", honors=True), async_scheduling=False).generate(
        PROMPTS, SAMPLING
    )
    assert [o.token_ids for o in out] == reference()


@pytest.mark.parametrize("embed", ["host", "raw"])
def test_not_opted_in_falls_back_and_stays_correct(embed):
    llm = LLM(toy_factory(embed=embed, honors=False), max_num_batched_tokens=8)
    out = llm.generate(PROMPTS, SAMPLING)
    assert [o.token_ids for o in out] == reference()
    assert (
        llm.stats.fallback_steps > 0 and llm.stats.async_steps > 0
    )  # prefill-only steps stay async


def test_refuse_names_the_model_and_the_fix_but_never_refuses_a_step_without_stale_rows():
    llm = LLM(toy_factory("BuggyHostLM", embed="host", honors=False), on_unhonored="refuse")
    first_tokens = llm.generate(PROMPTS, SamplingParams(max_tokens=1))  # prefill only: allowed
    assert [o.token_ids for o in first_tokens] == [ids[:1] for ids in reference()]
    with pytest.raises(
        ContractViolation,
        match=r"model 'BuggyHostLM'.*did not declare honors_device_token_ids=True, and on_unhonored='refuse'\. Fix:",
    ):
        llm.generate(PROMPTS, SAMPLING)
    assert llm.stats.fallback_steps == 0


def test_reading_the_raw_buffer_in_a_forward_is_refused_naming_the_rows():
    """A forward declared honouring that reads ``placeholder_buffer()`` on a spliced step raises
    there, whatever it embeds with: a masking embedding (vLLM's) would make the placeholders fluent
    wrong tokens, a plain ``nn.Embedding`` an ``IndexError`` naming nothing."""
    llm = LLM(toy_factory(embed="raw", honors=True), max_num_batched_tokens=64)
    with pytest.raises(
        StaleHostTokensError, match=r"placeholder_buffer\(\) in forward .*toy_forward_placeholder_buffer: .*rows \[0, 1, 2\]"
    ) as caught:
        llm.generate(PROMPTS, SAMPLING)
    assert caught.value.rows == (0, 1, 2)
    assert llm.stats.finished_requests == 0  # nothing was returned


def test_embedding_the_private_buffer_is_caught_by_the_guarded_embedding():
    llm = LLM(toy_factory(embed="private", honors=True), max_num_batched_tokens=64)
    with pytest.raises(
        EmbeddedBadIdsError, match=r"ids outside \[0, vocab=128\).*rows \[0, 1, 2\]"
    ) as caught:
        llm.generate(PROMPTS, SAMPLING)
    assert set(caught.value.ids) == {PLACEHOLDER}
    assert llm.stats.finished_requests == 0  # nothing was returned
    # Recorded in step 2 (the first decode step) without a host sync, raised at that step's sync
    # point, which the async path reaches after launching step 3.
    assert llm.stats.async_steps == 3


def test_outputs_never_hold_a_placeholder():
    for async_scheduling in (True, False):
        out = LLM(toy_factory(), async_scheduling=async_scheduling).generate(PROMPTS, SAMPLING)
        assert all(0 <= t < 128 for o in out for t in o.token_ids)
