"""Forwards that read the ids themselves: direct reads, locals, guards."""

import torch
from torch import Tensor

from czoo.models import FunctionalEmbedder, IndexEmbedder, TinyLM, TorchEmbedder
from tokenstate.contracts import ForwardInput, entry_point
from tokenstate.runtime.kernels import guarded_embedding


@entry_point
def device_direct(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.device_tokens.ids if inp.device_tokens is not None else inp.host_tokens.ids
    return model.logits(model.embed(ids), inp.logits_indices)


@entry_point
def embedding_ids_local(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.embedding_ids()
    tokens = ids.long()
    hidden = guarded_embedding(tokens, model.weight)
    return model.logits(hidden, inp.logits_indices)


@entry_point
def host_direct(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.ids.to(inp.device)
    return model.logits(model.embed(ids), inp.logits_indices)


@entry_point
def host_rows(model: TinyLM, inp: ForwardInput) -> Tensor:
    rows = [inp.host_tokens.row_ids(r.row) for r in inp.layout.rows]
    hidden = [guarded_embedding(row, model.weight) for row in rows]
    return model.logits(torch.cat(hidden), inp.logits_indices)


@entry_point
def placeholder_buffer(model: TinyLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.host_tokens.placeholder_buffer()), inp.logits_indices)


@entry_point
def guarded_fallback(model: TinyLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is None:
        ids = inp.host_tokens.ids.to(inp.device)
    else:
        ids = inp.device_tokens.ids
    return model.logits(model.embed(ids), inp.logits_indices)


@entry_point
def early_return_guard(model: TinyLM, inp: ForwardInput) -> Tensor:
    device = inp.device_tokens
    if device is not None:
        return model.logits(model.embed(device.ids), inp.logits_indices)
    return model.logits(model.embed(inp.host_tokens.ids), inp.logits_indices)


@entry_point
def fresh_when_no_stale_rows(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.embedding_ids() if inp.has_stale_rows else inp.host_tokens.ids
    return model.logits(model.embed(ids), inp.logits_indices)


@entry_point
def inverted_guard(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.ids if inp.device_tokens is not None else inp.embedding_ids()
    return model.logits(model.embed(ids), inp.logits_indices)


@entry_point
def torch_embedding_device(model: TorchEmbedder, inp: ForwardInput) -> Tensor:
    return model(inp.embedding_ids().long())[inp.logits_indices]


@entry_point
def index_gather_host(model: IndexEmbedder, inp: ForwardInput) -> Tensor:
    return model(inp.host_tokens.ids)[inp.logits_indices]


@entry_point
def functional_host(model: FunctionalEmbedder, inp: ForwardInput) -> Tensor:
    return model(inp.host_tokens.ids)[inp.logits_indices]


@entry_point
def private_host_buffer(model: TinyLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.host_tokens._ids), inp.logits_indices)


def maybe_has_device_ids(inp: ForwardInput) -> bool:
    if inp.num_rows > 1:
        return False  # "batched steps carry no device ids": wrong, and not a test of device ids
    return inp.device_tokens is not None


@entry_point
def helper_that_is_no_guard(model: TinyLM, inp: ForwardInput) -> Tensor:
    ids = inp.device_tokens.ids if maybe_has_device_ids(inp) else inp.host_tokens.ids
    return model.logits(model.embed(ids), inp.logits_indices)
