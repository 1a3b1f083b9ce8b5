"""functools.partial around the embedding and around the id source."""

import functools

from torch import Tensor

from czoo.helpers import device_ids_of, embed_ids, host_ids_of
from czoo.models import TinyLM
from tokenstate.contracts import ForwardInput, entry_point
from tokenstate.runtime.kernels import guarded_embedding


@entry_point
def partial_sink(model: TinyLM, inp: ForwardInput) -> Tensor:
    embed = functools.partial(guarded_embedding, weight=model.weight)
    return model.logits(embed(inp.embedding_ids()), inp.logits_indices)


@entry_point
def partial_source_device(model: TinyLM, inp: ForwardInput) -> Tensor:
    read = functools.partial(device_ids_of, inp)
    return model.logits(embed_ids(read(), model.weight), inp.logits_indices)


@entry_point
def partial_source_host(model: TinyLM, inp: ForwardInput) -> Tensor:
    read = functools.partial(host_ids_of, inp)
    return model.logits(embed_ids(read(), model.weight), inp.logits_indices)
