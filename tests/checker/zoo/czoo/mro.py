"""Diamond and mixin hierarchies: only Python's C3 order picks the override the model really runs.

Depth-first resolution of `Diamond(Left, Right)` visits `Base` before `Right`; C3 visits `Right`
first. Each pair below is built so that depth-first gets the verdict wrong in one direction.
"""

from torch import Tensor, nn

from czoo.servable import HIDDEN, VOCAB, ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class HostIdsBase(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class HostLeft(HostIdsBase):
    """Inherits the host read; adds nothing."""


class DeviceRight(HostIdsBase):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class CorrectDiamond(HostLeft, DeviceRight):
    """C3: CorrectDiamond, HostLeft, DeviceRight, HostIdsBase — DeviceRight's override runs."""


class DeviceIdsBase(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class DeviceLeft(DeviceIdsBase):
    """Inherits the device read; adds nothing."""


class HostRight(DeviceIdsBase):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class WrongDiamond(DeviceLeft, HostRight):
    """C3: WrongDiamond, DeviceLeft, HostRight, DeviceIdsBase — HostRight's override runs."""


@entry_point
def diamond_correct(model: CorrectDiamond, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def diamond_wrong(model: WrongDiamond, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


class DoubledMixin(nn.Module):
    """A mixin that runs before the real embedding in the MRO: its super() is nn.Embedding."""

    def forward(self, input_ids: Tensor) -> Tensor:
        return super().forward(input_ids) * 2.0


class DoubledEmbedding(DoubledMixin, nn.Embedding):
    """C3: DoubledEmbedding, DoubledMixin, nn.Embedding, nn.Module (depth-first: nn.Module first)."""


class MixinEmbeddingLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.embed_tokens = DoubledEmbedding(VOCAB, HIDDEN)
        self.embed_tokens.weight = self.weight  # seeded: sync and async engines build the same model


@entry_point
def mixin_embedding_device(model: MixinEmbeddingLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed_tokens(inp.embedding_ids().long()), inp)


@entry_point
def mixin_embedding_host(model: MixinEmbeddingLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed_tokens(inp.host_tokens.ids.long()), inp)
