"""Freshness guards the checker must recognise: isinstance on the device tokens, helper predicates."""

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import DeviceTokens, ForwardInput, entry_point


def has_device_ids(inp: ForwardInput) -> bool:
    return inp.device_tokens is not None


def host_ids_are_fresh(inp: ForwardInput) -> bool:
    return not has_device_ids(inp)


def token_ids(inp: ForwardInput) -> Tensor:
    if isinstance(inp.device_tokens, DeviceTokens):
        return inp.device_tokens.ids
    return inp.host_tokens.ids


@entry_point
def isinstance_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(token_ids(inp)), inp)


@entry_point
def isinstance_guard_inverted(model: ServableLM, inp: ForwardInput) -> Tensor:
    if isinstance(inp.device_tokens, DeviceTokens):
        ids = inp.host_tokens.ids
    else:
        ids = inp.embedding_ids()
    return model.logits(model.embed(ids), inp)


@entry_point
def helper_predicate(model: ServableLM, inp: ForwardInput) -> Tensor:
    if has_device_ids(inp):
        ids = inp.device_tokens.ids
    else:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def helper_predicate_negated(model: ServableLM, inp: ForwardInput) -> Tensor:
    fresh = host_ids_are_fresh(inp)
    ids = inp.host_tokens.ids if fresh else inp.device_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def helper_predicate_wrong_side(model: ServableLM, inp: ForwardInput) -> Tensor:
    if has_device_ids(inp):
        ids = inp.host_tokens.ids
    else:
        ids = inp.embedding_ids()
    return model.logits(model.embed(ids), inp)
