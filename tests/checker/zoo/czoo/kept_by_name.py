"""State kept beyond the call under a name spelt at run time: a buffer registered from the forward
(``self.register_buffer("last_ids", ids)``), a module global written through ``globals()`` and an
attribute written through ``obj.__dict__``.

Each is the plain assignment it spells (``self.last_ids = ids``, ``global KEPT; KEPT = ids``): host
ids kept that way on fresh steps and embedded on every step hand a stale step an earlier step's ids.
"""

import torch
from torch import Tensor

from czoo.persistent import fit
from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_KEPT_IDS = torch.zeros(1, dtype=torch.long)  # [1]: until the first fresh step writes it


class RegisteringLM(ServableLM):
    """Registers the last fresh step's ids as a buffer, from its forward."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.register_buffer("last_ids", torch.zeros(1, dtype=torch.long), persistent=False)

    def forward(self, inp: ForwardInput) -> Tensor:
        if not inp.has_stale_rows:
            self.register_buffer("last_ids", inp.host_tokens.ids.clone(), persistent=False)
        return self.logits(self.embed(fit(self.last_ids, inp.num_tokens)), inp)


def build_registering(config: dict, *, device: torch.device, seed: int) -> RegisteringLM:
    return RegisteringLM(config).to(device)


@entry_point
def a_buffer_registered_on_fresh_steps(model: RegisteringLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def globals_keep_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        globals()["_KEPT_IDS"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(_KEPT_IDS, inp.num_tokens)), inp)


@entry_point
def globals_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        globals()["_KEPT_IDS"] = inp.host_tokens.ids
    else:
        globals()["_KEPT_IDS"] = inp.device_tokens.ids
    return model.logits(model.embed(_KEPT_IDS), inp)


@entry_point
def instance_dict_keeps_host_ids_of_fresh_steps(model: RegisteringLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        model.__dict__["kept_ids"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(model.kept_ids, inp.num_tokens)), inp)
