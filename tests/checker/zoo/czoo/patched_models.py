"""Models whose methods another module of the package replaces when the package is imported
(``czoo.model_patches``, imported by ``czoo/__init__.py``), as liger-kernel and unsloth patch
transformers' classes: the method the forward calls is the patch, not the body's ``def``.
"""

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class PatchedToHostLM(ServableLM):
    """Its body reads device ids; the patch reads host ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class PatchedToDeviceLM(ServableLM):
    """Its body reads host ids; the patch reads device ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


@entry_point
def a_method_patched_to_read_host_ids(model: PatchedToHostLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_device_ids(model: PatchedToDeviceLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)
