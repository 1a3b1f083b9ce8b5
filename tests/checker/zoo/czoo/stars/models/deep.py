from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput

__all__ = ["DeepDeviceLM", "DeepHostLM"]


class DeepDeviceLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


class DeepHostLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.host_tokens.ids), inp)
