"""Forwards that embed no token ids: pooling over positions, a positional table."""

import torch
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput, entry_point


class PositionPooler(nn.Module):
    def __init__(self, max_len: int, hidden: int) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_len, hidden)
        self.head = nn.Linear(hidden, 2)

    def forward(self, positions: Tensor) -> Tensor:
        return self.head(self.positions(positions))


@entry_point
def position_pooling(model: PositionPooler, inp: ForwardInput) -> Tensor:
    num_tokens = len(inp.host_tokens.stale)
    pooled = model(inp.positions).mean(dim=0, keepdim=True)
    return pooled.expand(num_tokens, -1)[inp.logits_indices]


@entry_point
def counts_tokens_only(model: PositionPooler, inp: ForwardInput) -> Tensor:
    width = inp.num_tokens  # batch metadata from the forward input: no host id is touched
    return torch.zeros(width, 2)[inp.logits_indices]


@entry_point
def counts_host_ids(model: PositionPooler, inp: ForwardInput) -> Tensor:
    width = inp.host_tokens.ids.shape[0]  # `.ids` is a read: it raises on a step with spliced rows
    return torch.zeros(width, 2)[inp.logits_indices]
