"""Where the model's class comes from: `build` returning `Model(cfg).to(device)`, and an annotated
base class whose factory builds a subclass (the runtime passes what `build` returns)."""

import torch
from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class DeviceBuilt(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostBuilt(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class AnnotatedBase(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostOverride(AnnotatedBase):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class DeviceOverride(AnnotatedBase):
    def embed(self, ids: Tensor) -> Tensor:
        return super().embed(ids) * 1.0


def build_device(config: dict, *, device: torch.device, seed: int) -> DeviceBuilt:
    return DeviceBuilt(config).to(device)


def build_host(config: dict, *, device: torch.device, seed: int) -> HostBuilt:
    return HostBuilt(config).to(device).eval()


def build_host_override(config: dict, *, device: torch.device, seed: int) -> AnnotatedBase:
    return HostOverride(config).to(device)


def build_device_override(config: dict, *, device: torch.device, seed: int) -> AnnotatedBase:
    return DeviceOverride(config).to(device)


@entry_point
def built_to_device(model, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def built_to_device_host(model, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def annotated_base_host_subclass(model: AnnotatedBase, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)


@entry_point
def annotated_base_device_subclass(model: AnnotatedBase, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.token_ids(inp)), inp)
