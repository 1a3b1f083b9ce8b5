"""Near variants of kept and patched state that the checker does not follow yet (RCK-80, owed): each
reads host ids where a stale step may use them, and each is judged honors or inert today.
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput, entry_point


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 8)

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class Wrapped(Base):
    pass


_original = Wrapped.ids_for


def _wrapping(self: Wrapped, inp: ForwardInput) -> Tensor:
    return _original(self, inp)


Wrapped.ids_for = _wrapping


@entry_point
def patch_wrapping_the_original(model: Wrapped, inp: ForwardInput) -> Tensor:
    return model.embed_tokens(model.ids_for(inp))


class LoopPatched(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 8)

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


def _host_ids_for(self: LoopPatched, inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


for _cls in (LoopPatched,):
    _cls.ids_for = _host_ids_for


@entry_point
def patched_in_a_loop(model: LoopPatched, inp: ForwardInput) -> Tensor:
    return model.embed_tokens(model.ids_for(inp))


class Meta(NamedTuple):
    positions: Tensor
    tokens: object


@entry_point
def named_tuple_read_by_iteration(model: Base, inp: ForwardInput) -> Tensor:
    tokens = list(Meta(inp.positions, inp.host_tokens))[1]
    return model.embed_tokens(tokens.ids)


class ReadyFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 8)

    def forward(self, inp: ForwardInput) -> Tensor:
        if not getattr(self, "_ready", False):
            self.staged = torch.zeros(4096, dtype=torch.long)
            self._ready = True
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.embed_tokens(self.staged[:n])


@entry_point
def lazy_buffer_behind_a_ready_flag(model: ReadyFlag, inp: ForwardInput) -> Tensor:
    return model(inp)


class DeviceIds(nn.Module):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostIds(DeviceIds):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class WithSource(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 8)
        self.ids_source = DeviceIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.embed_tokens(self.ids_source(inp))


def build_swapped(config: dict, *, device: torch.device, seed: int) -> WithSource:
    model = WithSource()
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if isinstance(child, DeviceIds):
                setattr(module, name, HostIds())
    return model.to(device)


@entry_point
def swapped_over_named_modules(model: WithSource, inp: ForwardInput) -> Tensor:
    return model(inp)
