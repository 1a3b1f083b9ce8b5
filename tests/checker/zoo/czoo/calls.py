"""Forwards that delegate the read to helper functions in another file."""

from torch import Tensor

from czoo import helpers
from czoo.models import TinyLM
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def via_helper(model: TinyLM, inp: ForwardInput) -> Tensor:
    hidden = helpers.embed_input(inp, model.weight)
    return model.logits(hidden, inp.logits_indices)


@entry_point
def via_host_helper(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = helpers.host_ids_of(inp)
    return model.logits(helpers.embed_ids(ids, model.weight), inp.logits_indices)
