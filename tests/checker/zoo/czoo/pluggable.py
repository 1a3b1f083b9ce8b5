"""A layer whose ``__new__`` builds the class a registry of replacements names, as vLLM's
``PluggableLayer`` does for out-of-tree implementations (``register_oot``): ``Layer()`` may be an
instance of another class, whose forward the checker cannot know from ``Layer``'s.
"""

from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

REPLACEMENTS: dict[str, type] = {}


class Pluggable(nn.Module):
    def __new__(cls, *args: object, **kwargs: object) -> "Pluggable":
        impl = REPLACEMENTS.get(cls.__name__, cls)
        return super().__new__(impl)

    @classmethod
    def register_replacement(cls, replacement: type) -> type:
        REPLACEMENTS[cls.__name__] = replacement
        return replacement


class IdsSource(Pluggable):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


@IdsSource.register_replacement
class HostIdsSource(IdsSource):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class PlainNew(nn.Module):
    """A ``__new__`` that only hands on its own class: nothing to follow."""

    def __new__(cls, *args: object, **kwargs: object) -> "PlainNew":
        return super().__new__(cls)

    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class OneIdsSource(nn.Module):
    """A singleton: ``__new__`` caches the one instance of its own class."""

    _instance = None

    def __new__(cls, *args: object, **kwargs: object) -> "OneIdsSource":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class SingletonLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = OneIdsSource()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def build_singleton(config: dict, *, device, seed: int) -> SingletonLM:
    return SingletonLM(config).to(device)


class PluggableLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = IdsSource()  # really a HostIdsSource

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


class PlainNewLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = PlainNew()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def build_pluggable(config: dict, *, device, seed: int) -> PluggableLM:
    return PluggableLM(config).to(device)


def build_plain_new(config: dict, *, device, seed: int) -> PlainNewLM:
    return PlainNewLM(config).to(device)


@entry_point
def a_layer_whose_new_picks_a_replacement(model: PluggableLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_layer_whose_new_keeps_its_class(model: PlainNewLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_singleton_layer_keeps_its_class(model: SingletonLM, inp: ForwardInput) -> Tensor:
    return model(inp)
