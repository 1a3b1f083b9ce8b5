"""Freshness guards the checker must recognise: isinstance on the device tokens, helper predicates."""

import dataclasses

import torch
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


@entry_point
def or_value_device_first(model: ServableLM, inp: ForwardInput) -> Tensor:
    # `or` returns an operand: the device tokens where present, else the (then fresh) host tokens
    return model.logits(model.embed((inp.device_tokens or inp.host_tokens).ids), inp)


@entry_point
def or_value_host_first(model: ServableLM, inp: ForwardInput) -> Tensor:
    # HostTokens is always true: `or` never gets to the device tokens
    return model.logits(model.embed((inp.host_tokens or inp.device_tokens).ids), inp)


@entry_point
def match_none_first(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp.device_tokens:
        case None:
            ids = inp.host_tokens.ids
        case device:
            ids = device.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def match_device_class_first(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp.device_tokens:
        case DeviceTokens() as device:
            ids = device.ids
        case _:
            ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def match_host_where_device(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp.device_tokens:
        case None:
            ids = inp.embedding_ids()
        case _:
            ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


ASYNC_IDS_SUPPORTED = False  # a per-model switch: "device ids not wired up yet"


@entry_point
def device_tokens_or_none_by_a_switch(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.device_tokens if ASYNC_IDS_SUPPORTED else None
    if tokens is None:  # None because of the switch, device ids or not: no guard
        ids = inp.host_tokens.ids
    else:
        ids = tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def device_tokens_kept_in_a_local(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.device_tokens
    if tokens is None:  # exactly "no device ids"
        ids = inp.host_tokens.ids
    else:
        ids = tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def empty_stale_rows_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    # no stale row: every host id is fresh; otherwise the device ids exist
    ids = inp.host_tokens.ids if not inp.host_tokens.stale_rows else inp.device_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def empty_stale_rows_guard_inverted(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.ids if inp.host_tokens.stale_rows else inp.embedding_ids()
    return model.logits(model.embed(ids), inp)


@entry_point
def stale_mask_any_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not bool(inp.host_tokens.stale.any()):  # no stale position: every host id is fresh
        ids = inp.host_tokens.ids
    else:
        ids = inp.device_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def stale_mask_any_item_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.host_tokens.stale.any().item():
        ids = inp.device_tokens.ids
    else:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def stale_mask_torch_any_guard_inverted(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.ids if torch.any(inp.host_tokens.stale) else inp.embedding_ids()
    return model.logits(model.embed(ids), inp)


@entry_point
def attribute_error_when_no_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:  # EAFP: None.ids raises AttributeError exactly when there are no device ids
        ids = inp.device_tokens.ids
    except AttributeError:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def attribute_error_from_more_than_the_device_read(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:
        ids = inp.device_tokens.ids
        model.helper_that_may_not_exist()  # another AttributeError: raised with device ids present
    except AttributeError:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def getattr_device_ids_or_none(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = getattr(inp.device_tokens, "ids", None)  # None exactly when there are no device ids
    if ids is None:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def getattr_device_ids_or_none_inverted(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = getattr(inp.device_tokens, "ids", None)
    if ids is not None:
        ids = inp.host_tokens.ids
    return model.logits(model.embed(ids if ids is not None else inp.embedding_ids()), inp)


# -- per-row tests and rebuilt inputs -------------------------------------------------------------


@entry_point
def host_ids_of_fresh_rows_only(model: ServableLM, inp: ForwardInput) -> Tensor:
    stale_rows = inp.host_tokens.stale_rows
    parts = []
    for r, row in enumerate(inp.layout.rows):
        if r in stale_rows:  # spliced: its ids are on the device
            parts.append(inp.device_tokens.ids[row.start : row.end])
        else:  # no spliced id in this row: its host ids are real
            parts.append(inp.host_tokens.row_ids(r))
    return model.logits(model.embed(torch.cat(parts)), inp)


@entry_point
def host_ids_of_stale_rows(model: ServableLM, inp: ForwardInput) -> Tensor:
    parts = []
    for r, row in enumerate(inp.layout.rows):
        if r not in inp.host_tokens.stale_rows:
            parts.append(inp.embedding_ids()[row.start : row.end])
        else:
            parts.append(inp.host_tokens.row_ids(r))
    return model.logits(model.embed(torch.cat(parts)), inp)


@entry_point
def fresh_rows_by_a_comprehension_filter(model: ServableLM, inp: ForwardInput) -> Tensor:
    stale_rows = inp.host_tokens.stale_rows
    fresh = [inp.host_tokens.row_ids(r) for r in range(inp.num_rows) if r not in stale_rows]
    assert sum(int(ids.numel()) for ids in fresh) <= inp.num_tokens
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def stale_rows_by_a_comprehension_filter(model: ServableLM, inp: ForwardInput) -> Tensor:
    stale_rows = inp.host_tokens.stale_rows
    spliced = [inp.host_tokens.row_ids(r) for r in range(inp.num_rows) if r in stale_rows]
    assert sum(int(ids.numel()) for ids in spliced) <= inp.num_tokens
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def replaced_input_keeps_its_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    inp = dataclasses.replace(inp, positions=inp.positions.clone())
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def replaced_input_without_its_device_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    bare = dataclasses.replace(inp, device_tokens=None)  # its tokens are not the step's
    return model.logits(model.embed(bare.embedding_ids()), inp)
