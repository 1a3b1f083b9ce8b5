"""A tiny servable LM the issue-13 zoo cases share, so each case also *runs* under the async runner.

Stateless and batch invariant: a position's logits depend only on the id embedded there, so a run
that embeds the right ids matches the synchronous path token for token, and one that embeds a
placeholder (or reads stale host ids) does not.
"""

import torch
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput
from tokenstate.runtime.kernels import guarded_embedding

VOCAB = 40
HIDDEN = 8


class ServableLM(nn.Module):
    vocab_size = VOCAB
    max_model_len = 64
    eos_token_id = None

    def __init__(self, config: dict | None = None) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(13)
        self.weight = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen), requires_grad=False)  # [vocab, hidden]
        self.head = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen), requires_grad=False)  # [vocab, hidden]
        self.bias = nn.Parameter(torch.randn(VOCAB, generator=gen), requires_grad=False)  # [vocab]

    def allocate_slots(self, num_slots: int) -> None:
        """Stateless: nothing per slot."""

    def reset_slot(self, slot: int) -> None:
        """Stateless: nothing per slot."""

    def embed(self, ids: Tensor) -> Tensor:
        return guarded_embedding(ids, self.weight)  # [num_tokens, hidden]

    def logits(self, hidden: Tensor, inp: ForwardInput) -> Tensor:
        rows = hidden.index_select(0, inp.logits_indices)  # [num_logits, hidden]
        return (rows.unsqueeze(1) * self.head).sum(dim=2)  # [num_logits, vocab]


def build_servable(config: dict, *, device: torch.device, seed: int) -> ServableLM:
    return ServableLM(config).to(device)
