"""Small modules the zoo forwards hold: four kinds of embedding, a tiny LM around each."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenstate.runtime.kernels import GuardedEmbedding, guarded_embedding


class GuardedEmbedder(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden))

    def forward(self, ids: Tensor) -> Tensor:
        return guarded_embedding(ids, self.weight)


class TorchEmbedder(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, hidden)

    def forward(self, ids: Tensor) -> Tensor:
        return self.table(ids)


class IndexEmbedder(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden))

    def forward(self, ids: Tensor) -> Tensor:
        return self.weight[ids]


class FunctionalEmbedder(IndexEmbedder):
    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


class TinyLM(nn.Module):
    """An LM whose embedder kind is chosen by config (the checker joins the alternatives)."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        kind = config["embedder"]
        if kind == "guarded":
            self.embed = GuardedEmbedder(config["vocab"], config["hidden"])
        elif kind == "module":
            self.embed = GuardedEmbedding(config["vocab"], config["hidden"])
        else:
            self.embed = TorchEmbedder(config["vocab"], config["hidden"])
        self.head = nn.Linear(config["hidden"], config["vocab"])
        self.weight = nn.Parameter(torch.empty(config["vocab"], config["hidden"]))

    def logits(self, hidden: Tensor, indices: Tensor) -> Tensor:
        return self.head(hidden[indices]).float()
