"""Decorators and hooks: code that runs around a forward without being called by name in it.

A decorator in the analysed package is followed — a logging wrapper that reads host ids, one that
swaps in another function, a registry that returns what it was given. A class decorator that
assigns methods, and a forward hook torch runs inside a module's call, are not followed: their
forwards are ``unknown``, never a silent ``honors``.
"""

import functools

import torch
from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

REGISTRY: dict[str, object] = {}


def log_tokens(fn):
    @functools.wraps(fn)
    def wrapper(model, inp):
        model.last_count = int(inp.host_tokens.ids.numel())  # a host read around every call
        return fn(model, inp)

    return wrapper


def count_tokens(fn):
    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        model.seen = args[0].num_tokens  # metadata only
        return fn(model, *args, **kwargs)

    return wrapper


def legacy_path(fn):
    def host_forward(model, inp):  # replaces the decorated function altogether
        return model.logits(model.embed(inp.host_tokens.ids), inp)

    return host_forward


def register(name):
    def add(fn):
        REGISTRY[name] = fn
        return fn

    return add


@entry_point
@log_tokens
def wrapper_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
@count_tokens
def wrapper_reads_metadata(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
@legacy_path
def decorator_swaps_in_a_host_forward(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
@register("device")
def registered_by_a_decorator_factory(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp)


class DecoratedMethodLM(ServableLM):
    @log_tokens
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def decorated_method_reads_host_ids(model: DecoratedMethodLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def debug_tokens(cls):
    inner = cls.forward

    def forward(self, inp):
        self.first_id = inp.host_tokens.ids[0]
        return inner(self, inp)

    cls.forward = forward
    return cls


@debug_tokens
class ClassDecoratedLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def class_decorator_assigns_forward(model: ClassDecoratedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class PreHookLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.table = nn.Embedding(40, 8)
        self.table.register_forward_pre_hook(self.use_host_ids)  # torch calls it inside self.table(...)
        self.step_input = None

    def use_host_ids(self, module, args):
        return (self.step_input.host_tokens.ids.long(),)

    def forward(self, inp: ForwardInput) -> Tensor:
        self.step_input = inp
        return self.table(inp.embedding_ids().long())


@entry_point
def forward_pre_hook_registered_at_construction(model: PreHookLM, inp: ForwardInput) -> Tensor:
    hidden = model(inp)
    return model.logits(hidden, inp)


class HookInForwardLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        torch.manual_seed(0)
        self.table = nn.Embedding(40, 8)

    def forward(self, inp: ForwardInput) -> Tensor:
        handle = self.table.register_forward_pre_hook(lambda module, args: (inp.host_tokens.ids.long(),))
        try:
            return self.logits(self.table(inp.embedding_ids().long()), inp)
        finally:
            handle.remove()


@entry_point
def forward_hook_registered_in_the_forward(model: HookInForwardLM, inp: ForwardInput) -> Tensor:
    return model(inp)
