"""Host-id reads that never reach an embedding: penalties, bias tables, statistics, metadata.

On a step with spliced rows each of them raises StaleHostTokensError or computes on placeholders,
so outside a freshness guard every one is a finding; the honouring variants read the device ids, take
metadata from the forward input, or read host ids only behind `inp.device_tokens is None`.
"""

import logging

import torch
from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_LOG = logging.getLogger(__name__)


@entry_point
def penalty_from_host_rows(model: ServableLM, inp: ForwardInput) -> Tensor:
    logits = model.logits(model.embed(inp.embedding_ids()), inp)
    seen = [inp.host_tokens.row_ids(r.row) for r in inp.layout.rows]  # a repetition penalty's history
    return logits - 0.1 * torch.stack([model.bias[s].sum() for s in seen]).sum()


@entry_point
def bias_from_placeholder_buffer(model: ServableLM, inp: ForwardInput) -> Tensor:
    hidden = model.embed(inp.embedding_ids())
    bias = model.bias.index_select(0, inp.host_tokens.placeholder_buffer().long().clamp(min=0))  # [num_tokens]
    return model.logits(hidden + bias.unsqueeze(1), inp)


@entry_point
def stats_len_of_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    width = len(inp.host_tokens.ids)  # "just a length", yet `.ids` raises on a spliced step
    return model.logits(model.embed(inp.embedding_ids()), inp) + 0.0 * width


@entry_point
def logging_host_numel(model: ServableLM, inp: ForwardInput) -> Tensor:
    _LOG.debug("tokens this step: %d", inp.host_tokens.ids.numel())  # the argument is read eagerly
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def penalty_from_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.embedding_ids()
    return model.logits(model.embed(ids) + model.bias[ids.long()].unsqueeze(1), inp)


@entry_point
def metadata_from_forward_input(model: ServableLM, inp: ForwardInput) -> Tensor:
    width = inp.num_tokens + inp.num_rows + int(inp.logit_rows.numel())  # no host id touched
    return model.logits(model.embed(inp.embedding_ids()), inp) + 0.0 * width


@entry_point
def host_penalty_when_no_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    logits = model.logits(model.embed(inp.embedding_ids()), inp)
    if inp.device_tokens is None:  # no row is spliced: the host ids are all fresh
        logits = logits + 0.0 * model.bias[inp.host_tokens.ids.long()].sum()
    return logits
