"""Builders for small, valid type-state objects used across the contracts tests."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    stale_position_mask,
)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


class Step:
    """A 3-row async step: row 0 a prefill chunk, row 1 a decode row (stale), row 2 a completing chunk.

    slots 4, 0, 2; rows cover 3, 1 and 2 tokens.
    """

    vocab = 11
    qsl = i32([0, 3, 4, 6])
    seq_lens = i32([3, 10, 7])
    prefill_lens = i32([5, 9, 7])
    slots = i32([4, 0, 2])
    num_drafts = i32([0, 0, 0])
    real_ids = i32([1, 2, 3, 8, 4, 5])

    def stale(self) -> torch.Tensor:
        return stale_position_mask(self.qsl, self.seq_lens, self.prefill_lens, self.num_drafts)

    def host(self) -> HostTokens:
        stale = self.stale()
        ids = torch.where(stale, torch.full_like(self.real_ids, PLACEHOLDER), self.real_ids)
        return HostTokens(ids, stale, self.qsl, self.slots)

    def device(self) -> DeviceTokens:
        return DeviceTokens.from_combine(self.real_ids.clone(), vocab_size=self.vocab)

    def layout(self) -> BatchLayout:
        return BatchLayout(self.qsl, self.seq_lens, self.slots, self.num_drafts, torch.tensor([2, 3, 5]))

    def forward_input(self, *, with_device: bool = True) -> ForwardInput:
        return ForwardInput(
            host_tokens=self.host(),
            device_tokens=self.device() if with_device else None,
            positions=torch.tensor([0, 1, 2, 9, 5, 6]),
            layout=self.layout(),
            logits_indices=torch.tensor([2, 3, 5]),
            slots=self.slots.long(),
        )


@pytest.fixture
def step() -> Step:
    return Step()
