"""A file whose text mentions the right field while its forward reads the wrong one."""

from torch import Tensor

from czoo.models import TinyLM
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def mentions_device_tokens(model: TinyLM, inp: ForwardInput) -> Tensor:
    # TODO: switch to inp.device_tokens once the async runner is on
    ids = inp.host_tokens.ids
    return model.logits(model.embed(ids), inp.logits_indices)
