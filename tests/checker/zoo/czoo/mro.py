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


class HostIdsMixin:
    """A plain mixin (not a module) listed after the module base, as transformers lists
    ``EmbeddingAccessMixin`` after ``nn.Module``: C3 puts it after ``nn.Module``, which does not
    define ``token_ids``, so the mixin's method is the one that runs."""

    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class DeviceIdsMixin:
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class EmbeddingAccessMixin:
    """transformers' accessor: the embedding module named by a class attribute."""

    _input_embed_layer = "embed_tokens"

    def get_input_embeddings(self) -> nn.Module:
        return getattr(self, self._input_embed_layer)


class HostMixinLM(ServableLM, HostIdsMixin):
    """C3: HostMixinLM, ServableLM, nn.Module, HostIdsMixin."""


class DeviceMixinLM(ServableLM, DeviceIdsMixin):
    """C3: DeviceMixinLM, ServableLM, nn.Module, DeviceIdsMixin."""


class AccessorLM(ServableLM, EmbeddingAccessMixin):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.embed_tokens.weight = self.weight  # seeded: sync and async engines build the same model


@entry_point
def mixin_after_module_host(model: HostMixinLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def mixin_after_module_device(model: DeviceMixinLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def accessor_mixin_device(model: AccessorLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.get_input_embeddings()(inp.embedding_ids().long()), inp)


@entry_point
def accessor_mixin_host(model: AccessorLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.get_input_embeddings()(inp.host_tokens.ids.long()), inp)
