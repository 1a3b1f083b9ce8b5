"""Scheduler: decode-first rows, token budget, chunked prefill, slots, stops and the extra token."""

from __future__ import annotations

import numpy as np
import pytest

from tokenstate.runtime import SamplingParams
from tokenstate.runtime.scheduler import Request, Scheduler


def make(request_id: int, prompt_len: int, eos: int | None = None, **params) -> Request:
    prompt = tuple(range(1, prompt_len + 1))
    return Request(request_id, prompt, SamplingParams(**params), seed=0, eos_token_ids=() if eos is None else (eos,))


def shape(batch) -> list[tuple[int, int, int, bool]]:
    """(request id, num_computed, num_new_tokens, samples) per row."""
    return [(r.request.request_id, r.num_computed, r.num_new_tokens, r.samples) for r in batch.rows]


def resolve(sched: Scheduler, batch, tokens: list[int]):
    update = sched.update(batch, np.array(tokens, dtype=np.int32))
    return update.finished, update.kept


def test_chunked_prefill_within_the_token_budget_then_decode_first():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=6, max_model_len=64)
    for i, n in enumerate((10, 3)):
        sched.add(make(i, n))
    first = sched.schedule()
    assert shape(first) == [(0, 0, 6, False)]  # the budget cuts request 0's prompt
    assert [r.request_id for r in first.admitted] == [0]
    second = sched.schedule()
    # Request 0 finishes its prefill (4 tokens) and request 1 gets the 2 tokens left of the budget.
    assert shape(second) == [(0, 6, 4, True), (1, 0, 2, False)]
    third = sched.schedule()
    # Decode rows come first: request 0 feeds its in-flight token before request 1's last chunk.
    assert shape(third) == [(0, 10, 1, True), (1, 2, 1, True)]
    assert [r.slot for r in sched.running] == [0, 1]


def test_max_num_seqs_limits_admission_and_a_freed_slot_is_reused():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    for i in range(3):
        sched.add(make(i, 2, max_tokens=1))
    batch = sched.schedule()
    assert shape(batch) == [(0, 0, 2, True), (1, 0, 2, True)]
    assert len(sched.waiting) == 1
    finished, kept = resolve(sched, batch, [7, 8])
    assert [r.request_id for r in finished] == [0, 1] and kept.tolist() == [True, True]
    assert [r.finish_reason for r in finished] == ["length", "length"]
    nxt = sched.schedule()
    assert shape(nxt) == [(2, 0, 2, True)]
    assert nxt.admitted[0].slot == 0  # the lowest free slot, re-seeded (prefill_len = its prompt)
    assert nxt.admitted[0].prefill_len == 2


def test_requests_admitted_together_take_the_lowest_free_slots_in_order_of_prompt_length():
    sched = Scheduler(max_num_seqs=6, max_num_batched_tokens=64, max_model_len=64)
    sched.add(make(0, 3, max_tokens=1))
    first = sched.schedule()
    assert first.admitted[0].slot == 0  # admitted alone: the lowest free slot
    for i, n in enumerate((9, 2, 5, 2), start=1):
        sched.add(make(i, n))
    batch = sched.schedule()
    # Slot 0 is busy; slots 1-4 go to requests 1-4 shortest prompt first (ties by arrival),
    # and the rows, still in arrival order, carry the slots their requests took.
    assert {r.request_id: r.slot for r in batch.admitted} == {2: 1, 4: 2, 3: 3, 1: 4}
    assert [(row.request.request_id, row.slot) for row in batch.rows] == [(1, 4), (2, 1), (3, 3), (4, 2)]


def test_decode_rows_stand_in_slot_order_chosen_by_priority_before_the_prefill_rows():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    for i, n in enumerate((9, 2, 5)):
        sched.add(make(i, n))
    prefill = sched.schedule()
    assert [(row.request.request_id, row.slot) for row in prefill.rows] == [(0, 2), (1, 0), (2, 1)]
    sched.add(make(3, 4))
    mixed = sched.schedule()
    # The decode rows in slot order (requests 1, 2, 0), then the newly admitted prefill row.
    assert [(row.request.request_id, row.slot) for row in mixed.rows] == [(1, 0), (2, 1), (0, 2), (3, 3)]
    assert shape(mixed)[-1] == (3, 0, 4, True)
    # The budget still picks decode rows by priority (arrival): with room for two, request 2 waits.
    sched.max_num_batched_tokens = 2
    tight = sched.schedule()
    assert [(row.request.request_id, row.slot) for row in tight.rows] == [(1, 0), (0, 2)]


def test_max_tokens_is_known_at_schedule_time_so_no_row_is_wasted():
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
    sched.add(make(0, 3, max_tokens=1))
    sched.schedule()  # the prefill samples the one allowed token, still in flight
    assert sched.schedule().rows == ()  # nothing more to feed until the host learns the token


def test_a_request_whose_in_flight_token_ends_it_gives_its_slot_to_a_waiting_one_at_once():
    """Async: a request whose last allowed token is still in flight cannot run again, so its slot
    goes to a waiting request in the very next step (as on the sync path, where the token is
    already known), instead of staying idle for a step. The late token still joins its output."""
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
    sched.add(make(0, 3, max_tokens=2))
    sched.add(make(1, 2, max_tokens=1))
    first = sched.schedule()  # request 0's prompt: samples its first token
    resolve(sched, first, [7])
    second = sched.schedule()  # its decode samples the last allowed token, still in flight
    req0 = second.rows[0].request
    third = sched.schedule()  # async: scheduled before step 2's token is known
    assert shape(third) == [(1, 0, 2, True)] and third.admitted[0].slot == 0
    assert sched.stats.slots_released_in_flight == 1
    late = sched.update(second, np.array([8], dtype=np.int32))  # kept, finishes request 0 ...
    assert late.finished == [req0] and req0.output_token_ids == [7, 8] and req0.finish_reason == "length"
    assert late.kept.tolist() == [True] and late.record.tolist() == [False]  # ... slot 0 is request 1's
    finished, _ = resolve(sched, third, [9])
    assert [r.request_id for r in finished] == [1] and not sched.has_unfinished


def test_a_request_whose_in_flight_drafts_may_not_end_it_keeps_its_slot():
    """Only a finish certain whatever the step emits frees a slot early: a drafted row emits 1 to
    ``1 + num_drafts`` tokens, and with fewer than all of them the request goes on."""
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64, num_speculative_tokens=2)
    sched.add(make(0, 3, max_tokens=4))
    sched.add(make(1, 2, max_tokens=1))
    resolve(sched, sched.schedule(), [7])
    drafted = sched.schedule()
    assert shape(drafted) == [(0, 3, 3, True)]  # its new token and 2 drafts: 2 to 4 generated
    assert sched.schedule().rows == () and sched.stats.slots_released_in_flight == 0


def test_async_extra_token_of_a_finished_request_is_discarded():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    sched.add(make(0, 2, eos=5, max_tokens=8))
    step1 = sched.schedule()
    step2 = sched.schedule()  # async: scheduled before step 1's token is known
    assert shape(step2) == [(0, 2, 1, True)]
    finished, kept = resolve(sched, step1, [5])  # step 1 sampled EOS
    assert [r.finish_reason for r in finished] == ["stop"] and kept.tolist() == [True]
    finished, kept = resolve(sched, step2, [9])
    assert finished == [] and kept.tolist() == [False]
    req = step1.rows[0].request
    assert req.output_token_ids == [5] and not sched.has_unfinished


@pytest.mark.parametrize(
    ("params", "tokens", "expected", "reason"),
    [
        ({"max_tokens": 3}, [4, 4, 4, 4], [4, 4, 4], "length"),
        ({"max_tokens": 9, "stop_token_ids": (6,)}, [4, 6, 4], [4, 6], "stop"),
        ({"max_tokens": 9}, [4, 2, 4], [4, 2], "stop"),  # 2 is the EOS below
        (
            {"max_tokens": 9, "ignore_eos": True},
            [2, 2, 2, 2],
            [2, 2, 2, 2],
            "length",
        ),  # context full
    ],
)
def test_stop_conditions(params, tokens, expected, reason):
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=6)
    sched.add(make(0, 2, eos=2, **params))
    req = None
    for token in tokens:
        batch = sched.schedule()
        if not batch.rows:
            break
        req = batch.rows[0].request
        resolve(sched, batch, [token])  # sync: resolve every step
    assert req is not None and req.output_token_ids == expected and req.finish_reason == reason


def test_kv_budget_preempts_the_latest_arrival_which_resumes_with_everything_known():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, kv_cache_tokens=9)
    sched.add(make(0, 4, max_tokens=2))
    sched.add(make(1, 4, max_tokens=8))
    first = sched.schedule()  # both prompts: 8 of 9 KV tokens
    resolve(sched, first, [7, 8])
    second = sched.schedule()  # request 0's decode needs 1 more: fits (9); request 1's does not
    assert shape(second) == [(0, 4, 1, True)]
    assert sched.stats.preemptions == 1 and [r.request_id for r in sched.waiting] == [1]
    resumed = sched.waiting[0]
    assert resumed.slot == -1 and resumed.num_computed == 0 and resumed.output_token_ids == [8]
    finished, _ = resolve(sched, second, [9])
    assert [r.request_id for r in finished] == [0]  # its second token: max_tokens reached
    again = sched.schedule()
    # Re-admitted (to the freed slot) with prefill_len = prompt + resolved output: 5 tokens.
    assert shape(again) == [(1, 0, 5, True)] and again.admitted[0].prefill_len == 5


def test_drafts_fit_the_kv_budget_left_after_the_rows_new_token():
    """A decode row's drafts take only the KV room its new token leaves: 4 of 5 tokens held, so
    the new token fills the budget and no draft fits (before: 1 draft, 6 tokens held of 5)."""
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64, kv_cache_tokens=5,
                      num_speculative_tokens=4)
    sched.add(make(0, 4, max_tokens=8))
    resolve(sched, sched.schedule(), [7])  # the prompt: 4 tokens held
    decode = sched.schedule()
    assert shape(decode) == [(0, 4, 1, True)] and decode.rows[0].num_drafts == 0
    assert sum(r.num_computed for r in sched.running) <= 5


def test_a_preempted_request_waits_for_its_in_flight_token_before_resuming():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, kv_cache_tokens=6)
    sched.add(make(0, 3, max_tokens=3))
    first = sched.schedule()
    req = first.rows[0].request
    sched.preempt(req)  # its sampled token is still in flight
    assert sched.schedule().rows == ()  # not re-admitted before the host knows that token
    resolve(sched, first, [4])
    again = sched.schedule()
    assert shape(again) == [(0, 0, 4, True)] and req.admissions == 2


def test_random_order_skips_rows_and_permutes_but_every_request_rejoins():
    sched = Scheduler(max_num_seqs=3, max_num_batched_tokens=3, max_model_len=64, order="random", seed=1)
    for i in range(3):
        sched.add(make(i, 1, max_tokens=6))
    served = {i: 0 for i in range(3)}
    while sched.has_unfinished:
        batch = sched.schedule()
        for row in batch.rows:
            served[row.request.request_id] += row.samples
        resolve(sched, batch, [4] * len(batch.sampling_rows))
    assert served == {0: 6, 1: 6, 2: 6}
    assert sched.stats.reordered_steps > 0
