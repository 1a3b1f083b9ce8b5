"""Facts through compound statements: ``try`` handlers, ``with`` blocks whose manager may swallow
an exception, ``elif`` chains and ``match`` cases that end the function.

The fast path of each "fallback" case raises on purpose, as a fused kernel that is missing on this
machine (no Triton) would: its handler then runs with device ids present.
"""

import contextlib

import torch
from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import DeviceTokens, ForwardInput, entry_point


class KernelUnavailable(RuntimeError):
    pass


def fused_embedding(model: ServableLM, ids: Tensor) -> Tensor:
    raise KernelUnavailable("the fused embedding kernel is not built for this device")


class UseDevicePath(Exception):
    pass


@contextlib.contextmanager
def fall_back_on_kernel_errors():
    try:
        yield
    except KernelUnavailable:
        pass  # swallowed: the statements after the `with` run


@entry_point
def try_device_kernel_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:
        if inp.device_tokens is not None:
            return model.logits(fused_embedding(model, inp.device_tokens.ids), inp)
    except KernelUnavailable:
        pass  # the handler runs exactly when the device path raised: device ids are present
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def raise_into_host_handler(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:
        if inp.device_tokens is not None:
            raise UseDevicePath()
        ids = inp.host_tokens.ids  # fresh: no device ids on this line
    except UseDevicePath:
        ids = inp.host_tokens.ids  # device ids are present here
    return model.logits(model.embed(ids), inp)


@entry_point
def try_device_path_reraises(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:
        if inp.device_tokens is not None:
            return model.logits(model.embed(inp.device_tokens.ids), inp)
    except KernelUnavailable:
        raise  # nothing falls through from the handler
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def try_both_paths_return(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is not None:
        try:
            return model.logits(model.embed(inp.device_tokens.ids), inp)
        except KernelUnavailable:
            return model.logits(model.embed(inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def suppress_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    with contextlib.suppress(KernelUnavailable):
        return model.logits(fused_embedding(model, inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def own_manager_swallows_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    with fall_back_on_kernel_errors():
        return model.logits(fused_embedding(model, inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def guarded_suppress_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is not None:
        with contextlib.suppress(KernelUnavailable):
            return model.logits(fused_embedding(model, inp.device_tokens.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def no_grad_early_return(model: ServableLM, inp: ForwardInput) -> Tensor:
    with torch.no_grad():  # swallows nothing: the early return's other side follows
        if inp.device_tokens is not None:
            return model.logits(model.embed(inp.device_tokens.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def elif_early_return(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.num_tokens == 0:
        return torch.zeros(0, model.vocab_size)
    elif inp.device_tokens is not None:
        return model.logits(model.embed(inp.device_tokens.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def elif_returns_the_host_side(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.num_tokens == 0:
        return torch.zeros(0, model.vocab_size)
    elif inp.device_tokens is None:
        return model.logits(model.embed(inp.host_tokens.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)  # device ids are present here


@entry_point
def match_device_case_returns(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp.device_tokens:
        case DeviceTokens() as device:
            return model.logits(model.embed(device.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@entry_point
def match_none_case_returns(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp.device_tokens:
        case None:
            return model.logits(model.embed(inp.host_tokens.ids), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)  # device ids are present here


@entry_point
def continue_under_device_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    pieces = []
    for _ in range(1):  # a micro-batch loop
        if inp.device_tokens is not None:
            pieces.append(model.embed(inp.device_tokens.ids))
            continue
        pieces.append(model.embed(inp.host_tokens.ids))  # reached only without device ids
    return model.logits(torch.cat(pieces), inp)


@entry_point
def break_under_device_guard_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    for _ in range(1):
        if inp.device_tokens is not None:
            break  # leaves the loop with device ids present ...
    return model.logits(model.embed(inp.host_tokens.ids), inp)  # ... and reads host ids after it
