"""Decorators: one that returns the function it wraps (functools.wraps style) is followed like the
function itself; compiling ones live in czoo.compiled."""

import functools

from torch import Tensor

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


@entry_point
def wrapping_decorator(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(embed_traced(model, inp.embedding_ids()), inp)


@entry_point
def wrapping_decorator_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(embed_traced(model, inp.host_tokens.ids), inp)
