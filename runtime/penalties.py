"""Logits processors that read a request's history: penalties and bad words.

**History is a type state, like input ids.** On the async path the host learns a sampled token one
step late, so the host's view of a request's output lacks its newest token (the host table holds
``PLACEHOLDER`` there). Every consumer here therefore reads the *device* token history
(:attr:`~tokenstate.runtime.mirror.DeviceMirror.history`, ``[num_slots, max_model_len]``), which the
runner writes on the device right after sampling, in both scheduling modes. The host supplies only
what it knows for sure — slots, the position being sampled, the prompt length, the words — never a
token it has not resolved. No host sync happens: bounds come from the host, values stay on the
device.

Semantics (the OpenAI / vLLM conventions):

* repetition penalty ``r``: for every token in the prompt or the output so far, a positive logit is
  divided by ``r`` and a negative one multiplied by ``r``;
* presence penalty ``a``: ``logit -= a`` for every token generated at least once;
* frequency penalty ``f``: ``logit -= f * count`` for every token generated ``count`` times;
* bad words: a word ``w`` bans ``w[-1]`` whenever the history ends with ``w[:-1]`` (a one-token word
  is always banned).

Rows without a processor get exact identities (``/1``, ``-0``), so mixing them in a batch changes
nothing, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BadWordPlan", "apply_penalties", "ban_bad_words", "plan_bad_words"]


def apply_penalties(
    logits: torch.Tensor,
    history: torch.Tensor,
    sample_slots: torch.Tensor,
    sample_positions: torch.Tensor,
    output_index: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    *,
    length: int,
) -> torch.Tensor:
    """Penalised logits.

    Args:
        logits: ``[n, vocab]`` float32.
        history: ``[num_slots, max_model_len]`` int32 device token history.
        sample_slots: ``[n]`` int64, slot of each logit.
        sample_positions: ``[n]`` int64, position of the token each logit samples: the history
            before it is ``[0, position)``.
        output_index: ``[n]`` int64, that token's index in the output (``position - prompt_len``).
        repetition, presence, frequency: ``[n]`` float32 penalties per logit.
        length: a host-known bound ``>= max(sample_positions)`` (columns of history to read).
    """
    num, vocab = logits.shape
    past = history.index_select(0, sample_slots)[:, :length].long()  # [n, length]
    pos = torch.arange(length, device=logits.device)  # [length]
    before = pos < sample_positions.unsqueeze(1)  # [n, length] bool: prompt and output so far
    generated = before & (pos >= (sample_positions - output_index).unsqueeze(1))  # output only
    zeros = torch.zeros(num, vocab, dtype=torch.float32, device=logits.device)  # [n, vocab]
    counts = zeros.scatter_add(1, past, generated.float())  # [n, vocab] output counts
    seen = zeros.scatter_add(1, past, before.float()) > 0  # [n, vocab] bool
    rep = repetition.unsqueeze(1)  # [n, 1]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - presence.unsqueeze(1) * (counts > 0) - frequency.unsqueeze(1) * counts


@dataclass(frozen=True, slots=True)
class BadWordPlan:
    """One step's (logit, bad word) pairs, built on the host from what it knows; matched on device.

    The prefix of pair ``i`` is compared right-aligned: column ``W - 1`` is the position just before
    the sampled one. Columns outside the word's prefix are masked out by ``need``.
    """

    logit: torch.Tensor  # [P] int64, logit row of the pair
    banned: torch.Tensor  # [P] int64, the word's last token
    history_index: torch.Tensor  # [P, W] int64, flat index into history.view(-1)
    expected: torch.Tensor  # [P, W] int32, the word's prefix (right-aligned)
    need: torch.Tensor  # [P, W] bool, the column belongs to the prefix


def plan_bad_words(
    logits: Sequence[tuple[int, int, int, tuple[tuple[int, ...], ...]]],
    *,
    max_model_len: int,
    device: torch.device,
) -> BadWordPlan | None:
    """Pairs for ``(logit row, slot, sampled position, words)`` entries; ``None`` when there are none.

    A word longer than the history before the sampled position can never match and is left out.
    """
    pairs = [
        (row, slot, position, word)
        for row, slot, position, words in logits
        for word in words
        if len(word) - 1 <= position
    ]
    if not pairs:
        return None
    width = max(len(word) - 1 for *_, word in pairs)
    count = len(pairs)
    rows = np.array([p[0] for p in pairs], dtype=np.int64)  # [P]
    banned = np.array([p[3][-1] for p in pairs], dtype=np.int64)  # [P]
    index = np.zeros((count, width), dtype=np.int64)  # [P, W]
    expected = np.zeros((count, width), dtype=np.int32)  # [P, W]
    need = np.zeros((count, width), dtype=bool)  # [P, W]
    for i, (_, slot, position, word) in enumerate(pairs):
        prefix = word[:-1]
        if prefix:
            cols = slice(width - len(prefix), width)
            index[i, cols] = slot * max_model_len + np.arange(position - len(prefix), position)
            expected[i, cols] = prefix
            need[i, cols] = True
    as_device = [torch.from_numpy(a).to(device) for a in (rows, banned, index, expected, need)]
    return BadWordPlan(*as_device)


def ban_bad_words(logits: torch.Tensor, history: torch.Tensor, plan: BadWordPlan) -> torch.Tensor:
    """``logits`` ``[n, vocab]`` with every matched bad word's last token set to ``-inf``."""
    values = history.view(-1).index_select(0, plan.history_index.flatten())  # [P * W] int32
    values = values.view(plan.expected.shape)  # [P, W]
    match = ((values == plan.expected) | ~plan.need).all(dim=1)  # [P] bool
    hits = torch.zeros(logits.shape, dtype=torch.int32, device=logits.device)  # [n, vocab]
    hits.index_put_((plan.logit, plan.banned), match.to(torch.int32), accumulate=True)
    return logits.masked_fill(hits > 0, float("-inf"))
