"""A model whose forward must embed the device ids on a stale step (the code under contract)."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput, entry_point


class TinyModel(nn.Module):
    def __init__(self, vocab_size: int = 32, hidden: int = 8) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, hidden)
        self.head = nn.Linear(hidden, vocab_size)


def ids_to_embed(inp: ForwardInput) -> Tensor:
    """``[num_tokens]`` the ids the forward embeds: the device ids whenever they are present."""
    return inp.embedding_ids()


@entry_point
def forward(model: TinyModel, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    hidden = model.embed(ids_to_embed(inp).long())  # [num_tokens, hidden]
    return model.head(hidden[inp.logits_indices])  # [num_logits, vocab]


def context_limit_of(model: TinyModel) -> int:
    """Longest sequence the model accepts (owed: it has no positional limit yet)."""
    raise NotImplementedError("TinyModel does not declare a context limit yet")


__all__ = ["TinyModel", "context_limit_of", "forward", "ids_to_embed", "torch"]
