"""Code the checker cannot follow: torch.compile (decorator or call) and activation checkpointing.

All are `unknown` — reported, never passed. (Not in the runtime cross-check: compiling on a CPU
runner would only slow the suite, and an unknown verdict has nothing to agree with.)
"""

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


@torch.compile
def embed_compiled(model: ServableLM, ids: Tensor) -> Tensor:
    return model.embed(ids)


@entry_point
def compiled_function(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(embed_compiled(model, inp.embedding_ids()), inp)


@entry_point
def compiled_module(model: ServableLM, inp: ForwardInput) -> Tensor:
    embed = torch.compile(model.embed)
    return model.logits(embed(inp.embedding_ids()), inp)


@entry_point
def checkpointed_embedding(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(checkpoint(model.embed, inp.embedding_ids(), use_reentrant=False), inp)
