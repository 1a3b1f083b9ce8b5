"""Token values stored beyond one forward call, or into containers after they are built.

Host ids read under a no-device-ids guard are fresh for *that* call only: cached on the model, they
are read by later calls where device ids are present (the previous step's ids: fluent wrong tokens,
no error). And the forward input or its tokens put into a dict, a list or a namespace after it was
built must be followed out of it.
"""

import types

import torch
from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class CachingLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.last_ids: Tensor | None = None  # host ids of the last step without spliced rows
        self.last_host = None  # the HostTokens of that step


def fit(ids: Tensor, n: int) -> Tensor:
    return ids if ids.shape[0] == n else ids[-1:].repeat(n)


@entry_point
def cached_host_ids(model: CachingLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        model.last_ids = inp.host_tokens.ids  # fresh on this step only
    return model.logits(model.embed(fit(model.last_ids, inp.num_tokens)), inp)


@entry_point
def cached_host_tokens(model: CachingLM, inp: ForwardInput) -> Tensor:
    if not inp.host_tokens.has_stale:
        model.last_host = inp.host_tokens  # fresh on this step only
    return model.logits(model.embed(fit(model.last_host.ids, inp.num_tokens)), inp)


@entry_point
def cached_and_used_under_the_guard(model: CachingLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        model.last_ids = inp.host_tokens.ids
        return model.logits(model.embed(model.last_ids), inp)  # the same step: fresh
    return model.logits(model.embed(inp.device_tokens.ids), inp)


@entry_point
def dict_item_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    batch = {}
    batch["tokens"] = inp.host_tokens
    return model.logits(model.embed(batch["tokens"].ids), inp)


@entry_point
def list_appended_input(model: ServableLM, inp: ForwardInput) -> Tensor:
    micro_batches = []
    micro_batches.append(inp)
    return model.logits(model.embed(micro_batches[0].host_tokens.ids), inp)


@entry_point
def dict_updated_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    kwargs = {}
    kwargs.update(tokens=inp.host_tokens)
    return model.logits(model.embed(kwargs["tokens"].ids), inp)


@entry_point
def list_item_assigned_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    states = [None]
    states[0] = inp.host_tokens
    return model.logits(model.embed(states[0].ids), inp)


@entry_point
def namespace_attribute_input(model: ServableLM, inp: ForwardInput) -> Tensor:
    context = types.SimpleNamespace()
    context.inp = inp
    return model.logits(model.embed(context.inp.host_tokens.ids), inp)


@entry_point
def list_appended_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    parts = []
    parts.append(inp.embedding_ids())
    return model.logits(model.embed(parts[0]), inp)


class BufferedLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        # vLLM's persistent input buffer (filled in place every step, CUDA-graph friendly)
        self.register_buffer("input_ids", torch.zeros(64, dtype=torch.int64), persistent=False)


@entry_point
def buffer_filled_in_place_with_host_ids(model: BufferedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if inp.device_tokens is None:  # fresh on this step only
        model.input_ids[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(model.input_ids[:n]), inp)  # async steps: an earlier step's ids


@entry_point
def buffer_filled_in_place_with_device_ids(model: BufferedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    model.input_ids[:n] = inp.embedding_ids()
    return model.logits(model.embed(model.input_ids[:n]), inp)
