"""The tests that carry the tiny-model spec's items."""

from __future__ import annotations

import pytest
import tiny_model
import torch
from mutants import embeds_host_buffer

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    stale_position_mask,
)


def stale_step(real: torch.Tensor) -> ForwardInput:
    """One prefill row (fresh) and one decode row whose id exists only on the device."""
    qsl = torch.tensor([0, 3, 4], dtype=torch.int32)  # [num_rows + 1]
    seq_lens = torch.tensor([3, 6], dtype=torch.int32)  # [num_rows]
    prefill_lens = torch.tensor([5, 5], dtype=torch.int32)  # [num_rows], by slot
    slots = torch.tensor([0, 1], dtype=torch.int32)  # [num_rows]
    stale = stale_position_mask(qsl, seq_lens, prefill_lens)  # [num_tokens] bool
    layout = BatchLayout(
        qsl, seq_lens, slots, torch.zeros(2, dtype=torch.int32), torch.tensor([2, 3])
    )
    return ForwardInput(
        host_tokens=HostTokens(torch.where(stale, PLACEHOLDER, real), stale, qsl, slots),
        device_tokens=DeviceTokens.from_combine(real, vocab_size=32),
        positions=torch.tensor([0, 1, 2, 5]),
        layout=layout,
        logits_indices=torch.tensor([2, 3]),
        slots=slots.long(),
    )


@pytest.mark.paid("TINY-1", before=embeds_host_buffer)
def test_embeds_device_ids_on_a_stale_step() -> None:
    model = tiny_model.TinyModel()
    real = torch.tensor([4, 7, 9, 30], dtype=torch.int32)  # [num_tokens]
    logits = tiny_model.forward(model, stale_step(real))
    expected = model.head(model.embed(real.long())[[2, 3]])
    torch.testing.assert_close(logits, expected)


@pytest.mark.owed("TINY-2")
def test_context_limit_declared() -> None:
    assert tiny_model.context_limit_of(tiny_model.TinyModel()) > 0
