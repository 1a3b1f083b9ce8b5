"""Code the checker cannot follow: torch.compile, activation checkpointing, compiling decorators.

All are `unknown` (reported, never passed); a decorator that returns the function it wraps
(functools.wraps style) is followed like the function itself.
"""

import functools

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


@traced
def embed_traced(model: ServableLM, ids: Tensor) -> Tensor:
    return model.embed(ids)


@torch.compile
def embed_compiled(model: ServableLM, ids: Tensor) -> Tensor:
    return model.embed(ids)


@entry_point
def wrapping_decorator(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(embed_traced(model, inp.embedding_ids()), inp)


@entry_point
def wrapping_decorator_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(embed_traced(model, inp.host_tokens.ids), inp)


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
