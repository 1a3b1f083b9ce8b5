"""Scopes: a context manager publishes the step's ids, a deep module consumes them.

Four publication mechanisms: a ContextVar set in ``__enter__``, a ``@contextmanager`` setting a
module global, a ``threading.local``, and a class attribute.
"""

import contextlib
import threading
from contextvars import ContextVar

from torch import Tensor, nn

from tokenstate.contracts import ForwardInput
from tokenstate.runtime.kernels import guarded_embedding

_CURRENT: ContextVar = ContextVar("czoo_scope", default=None)
_STATE = threading.local()
_GLOBAL_IDS = None


class TokenScope:
    """Publishes the step's device ids (or fresh host ids) through a ContextVar."""

    def __init__(self, inp: ForwardInput) -> None:
        self.inp = inp
        self._token = None

    def __enter__(self) -> "TokenScope":
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)

    def ids(self) -> Tensor:
        return self.inp.embedding_ids()


class HostScope(TokenScope):
    """The bug in scope form: publishes host ids."""

    def ids(self) -> Tensor:
        return self.inp.host_tokens.ids


def current_ids() -> Tensor:
    scope = _CURRENT.get()
    if scope is None:
        raise RuntimeError("no scope")
    return scope.ids()


@contextlib.contextmanager
def global_ids_scope(ids: Tensor):
    global _GLOBAL_IDS
    previous, _GLOBAL_IDS = _GLOBAL_IDS, ids
    try:
        yield ids
    finally:
        _GLOBAL_IDS = previous


@contextlib.contextmanager
def local_scope(inp: ForwardInput):
    _STATE.inp = inp
    yield
    _STATE.inp = None


class StepIds:
    """Class-attribute publication: ``StepIds.active`` holds the ids while a step runs."""

    active = None

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids

    def __enter__(self) -> None:
        StepIds.active = self.ids

    def __exit__(self, *exc: object) -> None:
        StepIds.active = None


class DeepEmbed(nn.Module):
    """Embeds whatever the open ContextVar scope publishes; takes no ids argument."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(Tensor(vocab, hidden))

    def forward(self) -> Tensor:
        return guarded_embedding(current_ids(), self.weight)


class GlobalEmbed(DeepEmbed):
    def forward(self) -> Tensor:
        return guarded_embedding(_GLOBAL_IDS, self.weight)


class LocalEmbed(DeepEmbed):
    def forward(self) -> Tensor:
        return guarded_embedding(_STATE.inp.embedding_ids(), self.weight)


class ClassAttrEmbed(DeepEmbed):
    def forward(self) -> Tensor:
        return guarded_embedding(StepIds.active, self.weight)


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class ScopedBackbone(nn.Module):
    """The embed sits two levels down and never sees an ids argument."""

    embed_class = DeepEmbed

    def __init__(self) -> None:
        super().__init__()
        self.embed = self.embed_class(10, 4)
        self.blocks = nn.ModuleList([Block(4) for _ in range(2)])

    def forward(self) -> Tensor:
        hidden = self.embed()
        for block in self.blocks:
            hidden = block(hidden)
        return hidden


class GlobalBackbone(ScopedBackbone):
    embed_class = GlobalEmbed


class LocalBackbone(ScopedBackbone):
    embed_class = LocalEmbed


class ClassAttrBackbone(ScopedBackbone):
    embed_class = ClassAttrEmbed
