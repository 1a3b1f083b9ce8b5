"""HF-shaped code: a scaled word embedding that subclasses nn.Embedding, and **kwargs plumbing."""

import torch
from torch import Tensor, nn

from czoo.servable import HIDDEN, VOCAB, ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class ScaledWordEmbedding(nn.Embedding):
    """HF's scaled word embedding: the lookup is the inherited nn.Embedding.forward."""

    def __init__(self, num_embeddings: int, embedding_dim: int, embed_scale: float = 1.0) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.embed_scale = embed_scale

    def forward(self, input_ids: Tensor) -> Tensor:
        return super().forward(input_ids) * self.embed_scale


class ScaledLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.embed_tokens = ScaledWordEmbedding(VOCAB, HIDDEN, 2.0)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(self.weight)

    def decoder(self, input_ids: Tensor | None = None, **kwargs) -> Tensor:
        return self.embed_tokens(input_ids)

    def run(self, inp: ForwardInput, **kwargs) -> Tensor:
        return self.logits(self.decoder(**kwargs), inp)


@entry_point
def scaled_embedding_device(model: ScaledLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed_tokens(inp.embedding_ids().long()), inp)


@entry_point
def scaled_embedding_host(model: ScaledLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed_tokens(inp.host_tokens.ids.long()), inp)


@entry_point
def kwargs_plumbing_device(model: ScaledLM, inp: ForwardInput) -> Tensor:
    extra = {"input_ids": inp.embedding_ids().long(), "use_cache": False}
    return model.run(inp, **extra)


@entry_point
def kwargs_plumbing_host(model: ScaledLM, inp: ForwardInput) -> Tensor:
    return model.run(inp, input_ids=inp.host_tokens.ids.long(), output_attentions=False)
