"""Token values kept where they outlive the forward call: a module global, a module-level buffer
filled in place, a class attribute, and the model's own buffer filled from the entry forward.

A path of the call that does not write such a place reads what an earlier call left there: ids
kept from a fresh step are that step's ids, embedded on a later, stale step as if they were its own
(fluent wrong tokens, no error). Written on every path before the read, they are this call's ids.
"""

import outside_buffers
import torch
from outside_buffers import OUTSIDE_INPUT_IDS
from torch import Tensor

from czoo import step_buffers
from czoo.servable import ServableLM
from czoo.step_buffers import SHARED_INPUT_IDS
from tokenstate.contracts import ForwardInput, HostTokens, entry_point

_INPUT_IDS = torch.zeros(4096, dtype=torch.long)  # [max_tokens]: vLLM's persistent input buffer, module-level
_STAGED_IDS = torch.zeros(4096, dtype=torch.long)  # [max_tokens]
_POSITIONS, _UNPACKED_IDS = torch.zeros(4096, dtype=torch.long), torch.zeros(4096, dtype=torch.long)  # [max_tokens] each
KEPT: HostTokens | None = None
KEPT_IN_A_BLOCK: HostTokens | None = None


def fit(ids: Tensor, n: int) -> Tensor:
    """``ids`` cut or padded to ``n`` positions (ids kept from another step have its length)."""
    return ids[:n] if ids.shape[0] >= n else torch.cat([ids, ids[-1:].repeat(n - ids.shape[0])])


@entry_point
def global_buffer_filled_on_fresh_steps_only(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        _INPUT_IDS[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(_INPUT_IDS[:n]), inp)  # stale steps: an earlier step's ids


@entry_point
def global_buffer_filled_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if inp.device_tokens is None:
        _STAGED_IDS[:n].copy_(inp.host_tokens.ids)
    else:
        _STAGED_IDS[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(_STAGED_IDS[:n]), inp)


@entry_point
def global_keeps_the_host_tokens_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    global KEPT
    if not inp.has_stale_rows:
        KEPT = inp.host_tokens
    return model.logits(model.embed(fit(KEPT.ids, inp.num_tokens)), inp)


@entry_point
def global_kept_inside_a_with_block(model: ServableLM, inp: ForwardInput) -> Tensor:
    global KEPT_IN_A_BLOCK
    with torch.no_grad():  # the block withdraws what its manager published, not what its body kept
        if not inp.has_stale_rows:
            KEPT_IN_A_BLOCK = inp.host_tokens
    return model.logits(model.embed(fit(KEPT_IN_A_BLOCK.ids, inp.num_tokens)), inp)


class Holder:
    """A class used as a namespace of step state."""

    ids: Tensor | None = None
    tokens: HostTokens | None = None
    staged: Tensor | None = None


@entry_point
def class_attribute_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        Holder.ids = inp.host_tokens.ids
    return model.logits(model.embed(fit(Holder.ids, inp.num_tokens)), inp)


@entry_point
def class_attribute_written_then_read(model: ServableLM, inp: ForwardInput) -> Tensor:
    Holder.tokens = inp.host_tokens
    return model.logits(model.embed(Holder.tokens.ids), inp)


@entry_point
def class_attribute_staged_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    Holder.staged = inp.embedding_ids()
    return model.logits(model.embed(Holder.staged), inp)


class RemembersLM(ServableLM):
    """Its class keeps the last fresh step's ids (``type(model).last_ids = ...``)."""


def build_remembers(config: dict, *, device: torch.device, seed: int) -> RemembersLM:
    return RemembersLM(config).to(device)


@entry_point
def type_attribute_keeps_host_ids_of_fresh_steps(model: RemembersLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        type(model).last_ids = inp.host_tokens.ids
    return model.logits(model.embed(fit(model.last_ids, inp.num_tokens)), inp)


class StagingLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.input_ids = torch.zeros(4096, dtype=torch.long)  # [max_tokens]


def build_staging(config: dict, *, device: torch.device, seed: int) -> StagingLM:
    return StagingLM(config).to(device)


@entry_point
def model_buffer_filled_on_every_path_by_the_forward(model: StagingLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids[:n].copy_(inp.host_tokens.ids)
    else:
        model.input_ids[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def model_buffer_filled_on_fresh_steps_by_the_forward(model: StagingLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(model.input_ids[:n]), inp)


class StagedLM(ServableLM):
    """Methods that stage a step's ids on the model for the forward to read (vLLM's
    ``_prepare_inputs``, then the run)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.step_ids: Tensor | None = None
        self.input_ids = torch.zeros(4096, dtype=torch.long)  # [max_tokens]

    def stage(self, inp: ForwardInput) -> None:
        if inp.device_tokens is None:
            self.step_ids = inp.host_tokens.ids
        else:
            self.step_ids = inp.device_tokens.ids

    def fill(self, inp: ForwardInput) -> None:
        n = inp.num_tokens
        if inp.device_tokens is None:
            self.input_ids[:n].copy_(inp.host_tokens.ids)
        else:
            self.input_ids[:n].copy_(inp.device_tokens.ids)

    def stage_fresh_steps_only(self, inp: ForwardInput) -> None:
        if not inp.has_stale_rows:
            self.step_ids = inp.host_tokens.ids


def build_staged(config: dict, *, device: torch.device, seed: int) -> StagedLM:
    return StagedLM(config).to(device)


@entry_point
def one_method_stages_the_ids_another_reads(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.stage(inp)
    return model.logits(model.embed(model.step_ids), inp)


@entry_point
def a_method_fills_the_buffer_the_forward_embeds(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.fill(inp)
    return model.logits(model.embed(model.input_ids[: inp.num_tokens]), inp)


@entry_point
def a_method_stages_on_fresh_steps_only(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.stage_fresh_steps_only(inp)
    return model.logits(model.embed(fit(model.step_ids, inp.num_tokens)), inp)


# -- state written in place, however spelt ---------------------------------------------------------


def copy_into(dst: Tensor, src: Tensor) -> None:
    dst[: src.shape[0]].copy_(src)


@entry_point
def a_helper_fills_the_model_buffer_on_fresh_steps(model: StagingLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        copy_into(model.input_ids, inp.host_tokens.ids)  # the helper's parameter is the model's buffer
    return model.logits(model.embed(model.input_ids[: inp.num_tokens]), inp)


@entry_point
def a_helper_fills_the_model_buffer_on_every_path(model: StagingLM, inp: ForwardInput) -> Tensor:
    copy_into(model.input_ids, inp.embedding_ids())
    return model.logits(model.embed(model.input_ids[: inp.num_tokens]), inp)


@entry_point
def an_out_argument_fills_the_model_buffer_on_fresh_steps(model: StagingLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        torch.index_select(inp.host_tokens.ids.long(), 0, torch.arange(n), out=model.input_ids[:n])
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def an_alias_of_the_model_buffer_filled_on_fresh_steps(model: StagingLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    buf = model.input_ids
    if not inp.has_stale_rows:
        buf.narrow(0, 0, n).index_copy_(0, torch.arange(n), inp.host_tokens.ids.long())
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def setattr_keeps_host_ids_of_fresh_steps(model: StagingLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        model.last_ids = inp.host_tokens.ids
    return model.logits(model.embed(fit(model.last_ids, inp.num_tokens)), inp)


_LAST: list = [None]


@entry_point
def a_module_list_slot_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        _LAST[0] = inp.host_tokens.ids
    return model.logits(model.embed(fit(_LAST[0], inp.num_tokens)), inp)


@entry_point
def an_imported_buffer_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        step_buffers.SHARED_INPUT_IDS[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(SHARED_INPUT_IDS[:n]), inp)


_RECENT_INPUTS: list = []


class CollectingLM(ServableLM):
    """A pre-hook keeps every step's input in a module-level list; the forward reads it back."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.register_forward_pre_hook(lambda module, args: _RECENT_INPUTS.append(args[0]))

    def forward(self, inp: ForwardInput) -> Tensor:
        if not inp.has_stale_rows:
            return self.logits(self.embed(inp.host_tokens.ids), inp)
        last_fresh = [p for p in _RECENT_INPUTS if not p.has_stale_rows][-1]
        return self.logits(self.embed(fit(last_fresh.host_tokens.ids, inp.num_tokens)), inp)


@entry_point
def a_hook_keeps_the_inputs_the_forward_reads_back(model: CollectingLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_collecting(config: dict, *, device: torch.device, seed: int) -> CollectingLM:
    return CollectingLM(config).to(device)


def copy_into_a_clone(dst: Tensor, src: Tensor) -> Tensor:
    dst = dst.clone()  # its own tensor now: the caller's stays as it was
    dst[: src.shape[0]].copy_(src)
    return dst


@entry_point
def a_helper_fills_its_own_clone_of_the_buffer(model: StagingLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is None:
        staged = copy_into_a_clone(model.input_ids, inp.host_tokens.ids)
    else:
        staged = copy_into_a_clone(model.input_ids, inp.device_tokens.ids)
    return model.logits(model.embed(staged[: inp.num_tokens]), inp)


@entry_point
def an_unbound_copy_fills_the_model_buffer_on_fresh_steps(model: StagingLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        torch.Tensor.copy_(model.input_ids[:n], inp.host_tokens.ids)  # the method, called unbound
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def a_buffer_outside_the_analysed_modules_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        OUTSIDE_INPUT_IDS[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(outside_buffers.OUTSIDE_INPUT_IDS[:n]), inp)


@entry_point
def a_buffer_bound_by_unpacking_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        _UNPACKED_IDS[:n] = inp.host_tokens.ids
    return model.logits(model.embed(_UNPACKED_IDS[:n]), inp)
