"""Patches applied when the package is imported: replace methods of ``czoo.patched_models``."""

from torch import Tensor

from czoo import patched_models
from czoo.patched_models import PatchedToDeviceLM
from tokenstate.contracts import ForwardInput


def host_ids_for(self: patched_models.PatchedToHostLM, inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


def device_ids_for(self: PatchedToDeviceLM, inp: ForwardInput) -> Tensor:
    return inp.embedding_ids()


patched_models.PatchedToHostLM.ids_for = host_ids_for
setattr(PatchedToDeviceLM, "ids_for", device_ids_for)  # noqa: B010 (the spelling under test)
