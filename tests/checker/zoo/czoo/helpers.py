"""Shared helpers other zoo files call (a grep of *this* file says nothing about its callers)."""

from torch import Tensor

from tokenstate.contracts import ForwardInput
from tokenstate.runtime.kernels import guarded_embedding


def embed_ids(ids: Tensor, weight: Tensor) -> Tensor:
    return guarded_embedding(ids, weight)  # [num_tokens, hidden]


def device_ids_of(inp: ForwardInput) -> Tensor:
    return inp.device_tokens.ids if inp.device_tokens is not None else inp.host_tokens.ids


def host_ids_of(inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


def embed_input(inp: ForwardInput, weight: Tensor) -> Tensor:
    return embed_ids(device_ids_of(inp), weight)
