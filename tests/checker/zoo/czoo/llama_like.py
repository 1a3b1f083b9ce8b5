"""Two architectures on the shared dense block: one delegates, one feeds it host ids."""

from torch import Tensor

from czoo.dense import DenseForCausalLM, DenseModel
from tokenstate.contracts import ForwardInput, entry_point

LlamaModel = DenseModel


class LlamaForCausalLM(DenseForCausalLM):
    backbone_class = LlamaModel


class MistralForCausalLM(DenseForCausalLM):
    def compute_logits(self, inp: ForwardInput) -> Tensor:
        hidden = self.model.forward_ids(inp.host_tokens.ids)
        return self.lm_head(hidden[inp.logits_indices]).float()


@entry_point
def llama_forward(model: LlamaForCausalLM, inp: ForwardInput) -> Tensor:
    return model.compute_logits(inp)


@entry_point
def mistral_forward(model: MistralForCausalLM, inp: ForwardInput) -> Tensor:
    return model.compute_logits(inp)


def build_llama(config: dict, *, device: str = "cpu", seed: int = 0) -> LlamaForCausalLM:
    return LlamaForCausalLM(config["vocab_size"], config["hidden_size"])


@entry_point
def unannotated_with_build(model, inp: ForwardInput) -> Tensor:
    return model.compute_logits(inp)
