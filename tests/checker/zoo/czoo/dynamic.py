"""Dispatch the checker cannot resolve statically: reported as unknown, never passed."""

from torch import Tensor

from czoo.models import TinyLM
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def getattr_dispatch(model: TinyLM, inp: ForwardInput) -> Tensor:
    embed = getattr(model, "embed_" + str(model.head.out_features))
    return model.logits(embed(inp.embedding_ids()), inp.logits_indices)


@entry_point
def unannotated_model(model, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp.logits_indices)


@entry_point
def callable_parameter(model: TinyLM, inp: ForwardInput, embed=None) -> Tensor:
    return model.logits(embed(inp.embedding_ids()), inp.logits_indices)
