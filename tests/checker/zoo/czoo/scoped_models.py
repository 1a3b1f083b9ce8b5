"""Forwards that publish ids in a scope instead of passing them down (the NemotronH pattern)."""

from torch import Tensor

from czoo.scopes import (
    ClassAttrBackbone,
    GlobalBackbone,
    HostScope,
    LocalBackbone,
    ScopedBackbone,
    StepIds,
    TokenScope,
    global_ids_scope,
    local_scope,
)
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def contextvar_scope(model: ScopedBackbone, inp: ForwardInput) -> Tensor:
    with TokenScope(inp):
        return model()[inp.logits_indices]


@entry_point
def contextvar_scope_host(model: ScopedBackbone, inp: ForwardInput) -> Tensor:
    with HostScope(inp):
        return model()[inp.logits_indices]


@entry_point
def no_scope_opened(model: ScopedBackbone, inp: ForwardInput) -> Tensor:
    return model()[inp.logits_indices]


@entry_point
def generator_scope(model: GlobalBackbone, inp: ForwardInput) -> Tensor:
    with global_ids_scope(inp.embedding_ids()):
        return model()[inp.logits_indices]


@entry_point
def generator_scope_host(model: GlobalBackbone, inp: ForwardInput) -> Tensor:
    with global_ids_scope(inp.host_tokens.ids):
        return model()[inp.logits_indices]


@entry_point
def thread_local_scope(model: LocalBackbone, inp: ForwardInput) -> Tensor:
    with local_scope(inp):
        return model()[inp.logits_indices]


@entry_point
def class_attribute_scope(model: ClassAttrBackbone, inp: ForwardInput) -> Tensor:
    with StepIds(inp.device_tokens.ids if inp.device_tokens is not None else inp.host_tokens.ids):
        return model()[inp.logits_indices]


@entry_point
def class_attribute_scope_raw(model: ClassAttrBackbone, inp: ForwardInput) -> Tensor:
    with StepIds(inp.host_tokens.placeholder_buffer()):
        return model()[inp.logits_indices]
