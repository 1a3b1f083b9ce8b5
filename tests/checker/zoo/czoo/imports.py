"""Modules loaded with importlib: a constant name is resolved like an import; a computed one is unknown."""

import importlib

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def import_module_constant(model: ServableLM, inp: ForwardInput) -> Tensor:
    helpers = importlib.import_module("czoo.helpers")
    return model.logits(helpers.embed_ids(helpers.device_ids_of(inp), model.weight), inp)


@entry_point
def import_module_constant_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    helpers = importlib.import_module("czoo.helpers")
    return model.logits(helpers.embed_ids(helpers.host_ids_of(inp), model.weight), inp)


@entry_point
def import_module_computed(model: ServableLM, inp: ForwardInput) -> Tensor:
    helpers = importlib.import_module("czoo." + type(model).__name__.lower()[:7])
    return model.logits(helpers.embed_ids(inp.embedding_ids(), model.weight), inp)
