"""The engine's own model: a tiny recurrent LM, and two forwards — one right, one with the bug.

Both are wrapped with ``@entry_point`` so every call is checked. ``forward`` embeds the ids the
contract says to embed; ``forward_reads_host`` embeds the host buffer, which on the async path holds
placeholders for decode rows — the bug tokenstate exists to catch.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ForwardInput, entry_point


class TinyRecurrentLM(torch.nn.Module):
    """Embedding -> per-slot running state -> lm head. The state makes every token depend on history."""

    def __init__(self, vocab_size: int = 64, hidden: int = 32, num_slots: int = 4, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.embed = torch.nn.Parameter(torch.randn(vocab_size, hidden, generator=gen))
        self.mix = torch.nn.Parameter(torch.randn(hidden, hidden, generator=gen) / hidden**0.5)
        self.head = torch.nn.Parameter(torch.randn(hidden, vocab_size, generator=gen))
        self.state = torch.zeros(num_slots, hidden)  # [num_slots, hidden] per-slot running state

    def reset_slot(self, slot: int) -> None:
        self.state[slot].zero_()

    def run(self, inp: ForwardInput, ids: Tensor) -> Tensor:
        """Advance each row's slot state over its query tokens; return the logits rows asked for."""
        hidden = torch.nn.functional.embedding(ids, self.embed)  # [num_tokens, hidden]
        outs = torch.empty_like(hidden)  # [num_tokens, hidden]
        for row in inp.layout.rows:
            h = self.state[row.slot]  # [hidden]
            for t in range(row.start, row.end):
                h = torch.tanh(hidden[t] + h @ self.mix)
                outs[t] = h
            self.state[row.slot] = h
        return outs[inp.logits_indices] @ self.head  # [num_logits, vocab]


@entry_point
def forward(model: TinyRecurrentLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    ids = inp.device_tokens.ids if inp.device_tokens is not None else inp.host_tokens.ids
    return model.run(inp, ids)


@entry_point
def forward_reads_host(model: TinyRecurrentLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    return model.run(inp, inp.host_tokens.ids)
