"""Sub-modules held in an ``nn.ModuleDict`` and reached by attribute, as nanoGPT writes them:
``self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(...)))``, then ``self.transformer.wte(ids)``."""

import torch
from torch import Tensor, nn

from czoo.servable import VOCAB, ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class NanoGPT(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, self.weight.shape[1])))
        with torch.no_grad():
            self.transformer.wte.weight.copy_(self.weight)


@entry_point
def module_dict_attribute_device(model: NanoGPT, inp: ForwardInput) -> Tensor:
    return model.logits(model.transformer.wte(inp.embedding_ids()), inp)


@entry_point
def module_dict_attribute_host(model: NanoGPT, inp: ForwardInput) -> Tensor:
    return model.logits(model.transformer.wte(inp.host_tokens.ids), inp)
