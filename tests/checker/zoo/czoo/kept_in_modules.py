"""State kept in another module's namespace, written through the module object: ``vars(state)["K"]``,
``sys.modules[__name__].__dict__["K"]``, ``setattr(state, "K", v)`` and ``state.K = v``.

Each is the module global it names (``K`` of ``czoo.step_buffers``, or of this module): host ids
kept that way on fresh steps and embedded on every step hand a stale step an earlier step's ids.
"""

import sys

import torch
from torch import Tensor

from czoo import step_buffers
from czoo.persistent import fit
from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_KEPT = torch.zeros(1, dtype=torch.long)  # [1]: until the first fresh step writes it


@entry_point
def module_vars_keep_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        vars(step_buffers)["KEPT_IDS"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(step_buffers.KEPT_IDS, inp.num_tokens)), inp)


@entry_point
def sys_modules_dict_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        sys.modules[__name__].__dict__["_KEPT"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(_KEPT, inp.num_tokens)), inp)


@entry_point
def module_attribute_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        step_buffers.KEPT_IDS = inp.host_tokens.ids
    return model.logits(model.embed(fit(step_buffers.KEPT_IDS, inp.num_tokens)), inp)


@entry_point
def module_setattr_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        setattr(step_buffers, "KEPT_IDS", inp.host_tokens.ids)  # noqa: B010 (the spelling under test)
    return model.logits(model.embed(fit(step_buffers.KEPT_IDS, inp.num_tokens)), inp)


@entry_point
def module_vars_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        vars(step_buffers)["KEPT_IDS"] = inp.host_tokens.ids
    else:
        vars(step_buffers)["KEPT_IDS"] = inp.device_tokens.ids
    return model.logits(model.embed(step_buffers.KEPT_IDS), inp)


@entry_point
def sys_modules_dict_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        sys.modules[__name__].__dict__["_KEPT"] = inp.host_tokens.ids
    else:
        sys.modules[__name__].__dict__["_KEPT"] = inp.device_tokens.ids
    return model.logits(model.embed(_KEPT), inp)


@entry_point
def module_attribute_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        step_buffers.KEPT_IDS = inp.host_tokens.ids
    else:
        step_buffers.KEPT_IDS = inp.device_tokens.ids
    return model.logits(model.embed(step_buffers.KEPT_IDS), inp)
