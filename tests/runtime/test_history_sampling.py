"""Penalties, bad words and the n-gram proposer against plain-loop references; every sampling
parameter must change what is generated (a feature that does nothing must not pass)."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import ConfigError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.penalties import apply_penalties, ban_bad_words, plan_bad_words
from tokenstate.runtime.spec_decode import propose_ngram


def test_penalties_match_a_per_token_reference():
    gen = torch.Generator().manual_seed(0)
    vocab, max_len = 12, 10
    history = torch.randint(0, vocab, (3, max_len), generator=gen, dtype=torch.int32)
    logits = torch.randn(2, vocab, generator=gen)
    slots, positions, prompt_lens = [2, 0], [7, 4], [3, 4]
    rep, pres, freq = [1.5, 0.8], [0.3, 0.0], [0.2, 0.7]
    got = apply_penalties(
        logits, history, torch.tensor(slots), torch.tensor(positions),
        torch.tensor([p - n for p, n in zip(positions, prompt_lens, strict=True)]),
        torch.tensor(rep), torch.tensor(pres), torch.tensor(freq), length=8,
    )  # fmt: skip
    for i, (slot, pos, plen) in enumerate(zip(slots, positions, prompt_lens, strict=True)):
        seen = history[slot, :pos].tolist()
        output = history[slot, plen:pos].tolist()
        for t in range(vocab):
            x = float(logits[i, t])
            if t in seen:
                x = x / rep[i] if x > 0 else x * rep[i]
            x -= pres[i] * (t in output) + freq[i] * output.count(t)
            assert abs(float(got[i, t]) - x) < 1e-5


def test_bad_words_ban_the_last_token_only_after_the_prefix():
    history = torch.tensor([[1, 2, 3, 4, 0, 0], [5, 2, 3, 9, 0, 0]], dtype=torch.int32)
    words = ((7,), (3, 8), (2, 3, 6), (1, 2, 3, 4, 5, 6, 7))  # the last one is longer than the history
    plan = plan_bad_words(
        [(0, 0, 3, words), (1, 1, 4, words)], max_model_len=6, device=torch.device("cpu")
    )
    banned = ban_bad_words(torch.zeros(2, 10), history, plan).isinf()
    # Row 0 samples position 3 after [1, 2, 3]; row 1 samples position 4 after [5, 2, 3, 9].
    assert banned[0].nonzero().flatten().tolist() == [6, 7, 8]
    assert banned[1].nonzero().flatten().tolist() == [7]
    assert plan_bad_words([(0, 0, 0, ((1, 2),))], max_model_len=6, device=torch.device("cpu")) is None


def test_ngram_proposer_continues_the_latest_match_and_falls_back_to_the_last_token():
    history = torch.tensor(
        [[1, 2, 3, 4, 1, 2, 0, 0], [7, 8, 7, 8, 7, 0, 0, 0], [4, 5, 6, 0, 0, 0, 0, 0]], dtype=torch.int32
    )
    drafts = propose_ngram(
        history, torch.tensor([0, 1, 2]), torch.tensor([6, 5, 3]), ngram_size=2, num_drafts=3, length_bound=6
    )
    # Slot 0: "1 2" occurred at 0 -> 3 4 1. Slot 1: "8 7" at 1 -> periodic 8 7 8. Slot 2: no match.
    assert drafts.tolist() == [[3, 4, 1], [8, 7, 8], [6, 6, 6]]


BASE = {"max_tokens": 16, "ignore_eos": True}
PROMPTS = [[5, 6, 7, 5, 6], [9, 3, 9, 3], [11, 12]]


@pytest.mark.parametrize(
    "extra",
    [
        {"repetition_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"frequency_penalty": 1.0},
        {"bad_words": "first-two-generated"},
    ],
)
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_every_history_parameter_changes_the_output(extra, async_scheduling):
    llm = LLM(toy_factory(), async_scheduling=async_scheduling)
    plain = llm.generate(PROMPTS, SamplingParams(**BASE))
    if extra.get("bad_words") == "first-two-generated":
        # Ban each request's first generated token after its prompt's last token, and the token
        # that followed it: both must disappear from those contexts.
        sampling = [
            SamplingParams(**BASE, bad_words=((p[-1], o.token_ids[0]), (o.token_ids[1],)))
            for p, o in zip(PROMPTS, plain, strict=True)
        ]
        changed = llm.generate(PROMPTS, sampling)
        for o, before in zip(changed, plain, strict=True):
            assert o.token_ids[0] != before.token_ids[0] and before.token_ids[1] not in o.token_ids
    else:
        changed = llm.generate(PROMPTS, SamplingParams(**BASE, **extra))
    assert [o.token_ids for o in changed] != [o.token_ids for o in plain]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
        ({"presence_penalty": float("nan")}, "presence_penalty must be a finite number"),
        ({"bad_words": [[]]}, "bad_words must be a sequence of non-empty"),
        ({"bad_words": [5]}, "bad_words must be a sequence of non-empty"),
    ],
)
def test_bad_history_parameters_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        SamplingParams(**kw)


def test_bad_word_outside_the_vocabulary_is_refused():
    with pytest.raises(ConfigError, match=r"bad_words \[\(1, 500\)\]"):
        LLM(toy_factory()).generate([[1]], SamplingParams(bad_words=[[1, 500]]))
