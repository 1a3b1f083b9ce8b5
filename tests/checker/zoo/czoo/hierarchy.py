"""Methods through a class hierarchy: self calls, sub-module attributes, overrides, super()."""

from torch import Tensor, nn

from czoo.models import GuardedEmbedder
from tokenstate.contracts import ForwardInput, entry_point


class BaseLM(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embedder = GuardedEmbedder(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()

    def embed(self, ids: Tensor) -> Tensor:
        return self.embedder(ids)

    def run(self, inp: ForwardInput) -> Tensor:
        return self.head(self.embed(self.token_ids(inp))[inp.logits_indices])


class DerivedLM(BaseLM):
    """Inherits everything: routes go through the base class's methods."""


class HostDerivedLM(BaseLM):
    """Overrides one method deep in the chain: only method resolution on the subclass sees it."""

    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class SuperLM(BaseLM):
    def embed(self, ids: Tensor) -> Tensor:
        return super().embed(ids) * 2.0


class Wrapper(nn.Module):
    """``model.model.run(inp)``: an attribute holding the real model."""

    def __init__(self, inner_kind: str) -> None:
        super().__init__()
        self.model = SuperLM(10, 4) if inner_kind == "super" else DerivedLM(10, 4)


@entry_point
def inherited(model: DerivedLM, inp: ForwardInput) -> Tensor:
    return model.run(inp)


@entry_point
def overridden_to_host(model: HostDerivedLM, inp: ForwardInput) -> Tensor:
    return model.run(inp)


@entry_point
def through_super(model: SuperLM, inp: ForwardInput) -> Tensor:
    return model.run(inp)


@entry_point
def nested_attribute(model: Wrapper, inp: ForwardInput) -> Tensor:
    return model.model.run(inp)


@entry_point
def nested_attribute_host(model: Wrapper, inp: ForwardInput) -> Tensor:
    return model.model.head(model.model.embed(inp.host_tokens.ids)[inp.logits_indices])
