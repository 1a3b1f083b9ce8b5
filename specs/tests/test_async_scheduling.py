"""Items of specs/async-scheduling.md: the bug families of async engines, each provoked on purpose."""

from __future__ import annotations

import pytest

from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.workload import Arrival, run_workload

from .async_scheduling_mutants import (
    bad_words_at_first_logit_only,
    combine_ignores_drafts,
    drafts_missing_from_history,
    drafts_only_for_plain_greedy,
    idle_rows_emit,
    penalties_read_host_history,
    resume_keeps_prefill_len,
    reused_slot_keeps_history,
    sampling_state_by_row,
    slot_held_until_last_token_resolves,
)

PROMPTS = [[5, 6, 7, 5, 6], [9, 3], [11, 12, 13, 14, 15, 16, 17], [4], [8, 8, 9, 8, 8]]


def both_paths(model, prompts, sampling, **engine_args):
    """Outputs and stats of a sync and an async engine over the same requests."""
    results = {}
    for async_scheduling in (False, True):
        llm = LLM(model, async_scheduling=async_scheduling, **engine_args)
        results[async_scheduling] = (llm.generate(prompts, sampling), llm.stats)
    return results[False], results[True]


@pytest.mark.paid("ASY-1", before=resume_keeps_prefill_len)
def test_resumed_request_reprefills_what_the_host_knows():
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    (sync, _), (async_, stats) = both_paths(
        toy_factory(), PROMPTS, params, max_num_seqs=4, max_num_batched_tokens=6, kv_cache_tokens=24
    )
    assert stats.preemptions > 0 and stats.async_steps > 0
    assert [o.token_ids for o in async_] == [o.token_ids for o in sync]
    assert all(len(o.token_ids) == 12 for o in async_)


@pytest.mark.paid("ASY-2", before=sampling_state_by_row)
def test_random_row_order_keeps_per_slot_state():
    sampling = [SamplingParams(max_tokens=8, temperature=t, seed=i) for i, t in enumerate((0.7, 1.3, 0.0, 2.0, 0.9))]
    alone = [
        LLM(toy_factory(), max_num_seqs=1).generate([p], s)[0].token_ids
        for p, s in zip(PROMPTS, sampling, strict=True)
    ]
    for async_scheduling in (False, True):
        llm = LLM(toy_factory(), async_scheduling=async_scheduling, max_num_seqs=5, scheduling_order="random", seed=3)
        outputs = llm.generate(PROMPTS, sampling)
        assert llm.stats.reordered_steps > 0
        assert [o.token_ids for o in outputs] == alone


@pytest.mark.paid("ASY-3", before=combine_ignores_drafts)
def test_drafts_are_stale_positions_spliced_on_the_device():
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = {"method": "ngram", "num_tokens": 3}
    (sync, sync_stats), (async_, stats) = both_paths(toy_factory(), PROMPTS, params, speculative=spec)
    plain = LLM(toy_factory(), async_scheduling=False).generate(PROMPTS, params)
    assert stats.drafts_accepted > 0 and stats.drafts_rejected > 0 and sync_stats.drafts_accepted > 0
    assert [o.token_ids for o in async_] == [o.token_ids for o in sync] == [o.token_ids for o in plain]


@pytest.mark.paid("ASY-4", before=penalties_read_host_history)
def test_history_readers_never_read_placeholders():
    sampling = [
        SamplingParams(max_tokens=10, repetition_penalty=1.8, ignore_eos=True),
        SamplingParams(max_tokens=10, presence_penalty=1.5, ignore_eos=True),
        SamplingParams(max_tokens=10, frequency_penalty=1.0, temperature=0.8, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=10, bad_words=((4,), (8, 9)), ignore_eos=True),
        SamplingParams(max_tokens=10, repetition_penalty=0.5, frequency_penalty=-0.5, ignore_eos=True),
    ]
    (sync, _), (async_, stats) = both_paths(toy_factory(), PROMPTS, sampling)
    assert stats.async_steps > 0
    assert [o.token_ids for o in async_] == [o.token_ids for o in sync]


@pytest.mark.paid("ASY-5", before=idle_rows_emit)
def test_idle_rows_emit_nothing():
    model = toy_factory("IdleRowsToy", eos_token_id=27)
    prompts = [[i, i + 1] for i in range(0, 120, 7)]
    params = SamplingParams(max_tokens=30)
    (sync, _), (async_, stats) = both_paths(model, prompts, params, max_num_seqs=4)
    assert stats.discarded_tokens > 0  # rows were scheduled for requests that had already stopped
    assert async_ == sync
    stopped = [o for o in async_ if o.finish_reason == "stop"]
    assert stopped and all(o.token_ids[-1] == 27 and 27 not in o.token_ids[:-1] for o in stopped)


@pytest.mark.paid("ASY-6", before=reused_slot_keeps_history)
def test_reused_slot_history_is_reseeded():
    params = SamplingParams(max_tokens=8, repetition_penalty=3.0, bad_words=((6, 5),), ignore_eos=True)
    # Each prompt is longer than its predecessor's prompt + output: the new occupant's prompt
    # positions are exactly where the previous one's generated tokens were written.
    prompts = ([5], list(range(40, 52)), [6] * 22, list(range(60, 92)))
    arrivals = [Arrival(0, tuple(p), params) for p in prompts]
    alone = [run_workload(LLM(toy_factory(), max_num_seqs=1), [a])[0].token_ids for a in arrivals]
    for async_scheduling in (False, True):
        llm = LLM(toy_factory(), async_scheduling=async_scheduling, max_num_seqs=1)
        assert [o.token_ids for o in run_workload(llm, arrivals)] == alone  # one slot, reused 3x


# Every request reads its history or samples, so each draft proposed is one of theirs. Frequency
# penalties below 0 and repetition penalties below 1 keep the toy model repeating (drafts accepted).
SPEC = {"method": "ngram", "num_tokens": 3}
PENALISED = [
    SamplingParams(max_tokens=32, frequency_penalty=-0.3, ignore_eos=True),
    SamplingParams(max_tokens=32, repetition_penalty=0.8, ignore_eos=True),
    SamplingParams(max_tokens=32, presence_penalty=0.1, frequency_penalty=0.05, ignore_eos=True),
]
BAD_WORDS = [  # (67, 72) and 59 59 are bigrams the toy model repeats on these prompts
    SamplingParams(max_tokens=32, frequency_penalty=-0.3, bad_words=((67, 72), (59, 59, 59)), ignore_eos=True),
    SamplingParams(max_tokens=32, repetition_penalty=0.8, bad_words=((109,),), ignore_eos=True),
]
SAMPLED = [
    SamplingParams(max_tokens=32, temperature=0.6, top_k=8, seed=4, ignore_eos=True),
    SamplingParams(max_tokens=32, temperature=0.3, top_p=0.9, seed=7, frequency_penalty=-0.3, ignore_eos=True),
]


def drafted_equals_plain(sampling) -> None:
    """Drafts are proposed, accepted and rejected on both paths, and change no token."""
    for params in sampling:
        plain = LLM(toy_factory(), async_scheduling=False).generate(PROMPTS, params)
        (sync, sync_stats), (async_, stats) = both_paths(toy_factory(), PROMPTS, params, speculative=SPEC)
        for s in (sync_stats, stats):
            assert s.drafts_accepted > 0 and s.drafts_rejected > 0, (params, s)
        assert [o.token_ids for o in async_] == [o.token_ids for o in sync] == [o.token_ids for o in plain], params


@pytest.mark.paid("ASY-7", before=drafts_only_for_plain_greedy)
def test_drafts_for_history_reading_and_sampled_requests():
    drafted_equals_plain(PENALISED[:1] + BAD_WORDS[:1] + SAMPLED)


@pytest.mark.paid("ASY-17", before=drafts_missing_from_history)
def test_penalties_at_a_draft_position_see_the_drafts_before_it():
    drafted_equals_plain(PENALISED)


@pytest.mark.paid("ASY-18", before=bad_words_at_first_logit_only)
def test_bad_words_are_banned_at_every_draft_position():
    drafted_equals_plain(BAD_WORDS)


@pytest.mark.paid("ASY-20", before=slot_held_until_last_token_resolves)
def test_a_finishing_request_gives_its_slot_to_a_waiting_one_in_the_same_step_as_sync():
    # Twelve requests through four slots, every one ending at its length limit: each wave's slots
    # must go to the next wave in the step where the sync engine frees them.
    prompts = [[3 + i, 4, 5 + i] for i in range(12)]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    (sync, sync_stats), (async_, stats) = both_paths(toy_factory(), prompts, params, max_num_seqs=4)
    assert [o.token_ids for o in async_] == [o.token_ids for o in sync]
    assert stats.slots_released_in_flight > 0 and stats.discarded_tokens == 0
    assert stats.total_steps == sync_stats.total_steps  # launched steps: not one more
