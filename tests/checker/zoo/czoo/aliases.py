"""Module aliases, re-exports and class aliases."""

from torch import Tensor

import czoo.helpers as H
from czoo import reexported_embed, reexported_host_ids
from czoo.hierarchy import DerivedLM as Backbone, HostDerivedLM
from tokenstate.contracts import ForwardInput, entry_point

HostBackbone = HostDerivedLM  # a class alias, like LlamaModel = DenseModel


@entry_point
def module_alias(model: Backbone, inp: ForwardInput) -> Tensor:
    return H.embed_ids(H.device_ids_of(inp), model.head.weight)[inp.logits_indices]


@entry_point
def reexport_host(model: Backbone, inp: ForwardInput) -> Tensor:
    return reexported_embed(reexported_host_ids(inp), model.head.weight)[inp.logits_indices]


@entry_point
def class_alias_honors(model: Backbone, inp: ForwardInput) -> Tensor:
    return model.run(inp)


@entry_point
def class_alias_host(model: HostBackbone, inp: ForwardInput) -> Tensor:
    return model.run(inp)
