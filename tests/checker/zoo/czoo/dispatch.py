"""Constant-key dict dispatch: `TABLE["dense"](...)` runs exactly one value of the table."""

from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


def device_ids(inp: ForwardInput) -> Tensor:
    return inp.embedding_ids()


def host_ids(inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


TOKEN_SOURCES = {"dense": device_ids, "legacy": host_ids}


class Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden * self.scale


class TableLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.sources = nn.ModuleDict({"plain": Scaled(1.0), "scaled": Scaled(2.0)})


@entry_point
def dict_dispatch_dense(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(TOKEN_SOURCES["dense"](inp)), inp)


@entry_point
def dict_dispatch_legacy(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(TOKEN_SOURCES["legacy"](inp)), inp)


@entry_point
def dict_get_dispatch(model: ServableLM, inp: ForwardInput) -> Tensor:
    source = TOKEN_SOURCES.get("dense")
    return model.logits(model.embed(source(inp)), inp)


@entry_point
def module_dict_dispatch(model: TableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.sources["plain"](model.embed(inp.embedding_ids())), inp)


TOKEN_READERS = {"dense": device_ids}
TOKEN_READERS["dense"] = host_ids  # filled at run time: the literal no longer tells what runs


@entry_point
def dict_filled_at_run_time(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(TOKEN_READERS["dense"](inp)), inp)
