"""A shared dense block several architectures reuse (the Llama pattern)."""

from torch import Tensor, nn

from czoo.models import GuardedEmbedder
from tokenstate.contracts import ForwardInput


class DenseLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(x)


class DenseModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed_tokens = GuardedEmbedder(vocab, hidden)
        self.layers = nn.ModuleList(DenseLayer(hidden) for _ in range(layers))

    def forward_ids(self, ids: Tensor) -> Tensor:
        hidden = self.embed_tokens(ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.forward_ids(inp.embedding_ids())


class DenseForCausalLM(nn.Module):
    backbone_class = DenseModel

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.model = self.backbone_class(vocab, hidden, 2)
        self.lm_head = nn.Linear(hidden, vocab)

    def compute_logits(self, inp: ForwardInput) -> Tensor:
        return self.lm_head(self.model(inp)[inp.logits_indices]).float()
