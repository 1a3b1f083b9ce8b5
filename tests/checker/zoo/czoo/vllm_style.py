"""How vLLM builds and wraps a model: ``make_layers`` concatenating stand-ins for other pipeline
stages around its own layers, ``islice`` over them, a class decorator that records a flag with
``setattr(cls, KEY, ...)`` (a module constant), and one that wraps ``__init__``
(``support_torch_compile`` does both); a forward context published around the forward, and a
rotary embedding taken from a cache filled at run time (``get_rope``) and given only positions.
"""

import contextlib
import contextvars
import itertools

from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

IGNORE_COMPILE_KEY = "_ignore_compile"


class MissingLayer(nn.Identity):
    """A layer another pipeline stage owns (vLLM's PPMissingLayer)."""


class EmbedLayer(nn.Module):
    def __init__(self, embed) -> None:
        super().__init__()
        self.embed = embed  # the model's method (the model itself as a submodule would be a cycle)

    def forward(self, ids: Tensor) -> Tensor:
        return self.embed(ids)


def make_layers(num_layers: int, layer_fn, start: int = 0, end: int | None = None):
    end = num_layers if end is None else end
    modules = nn.ModuleList(
        [MissingLayer() for _ in range(start)]
        + [layer_fn(i) for i in range(start, end)]
        + [MissingLayer() for _ in range(end, num_layers)]
    )
    return start, end, modules


class StagedLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.start, self.end, self.layers = make_layers(2, lambda i: EmbedLayer(self.embed))

    def step_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()

    def forward(self, inp: ForwardInput) -> Tensor:
        hidden = None
        for layer in itertools.islice(self.layers, self.start, self.end):
            hidden = layer(self.step_ids(inp))
        return self.logits(hidden, inp)


class HostStagedLM(StagedLM):
    def step_ids(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


@entry_point
def layers_made_for_a_pipeline_stage_device(model: StagedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def layers_made_for_a_pipeline_stage_host(model: HostStagedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def mark_ignore_compile(cls):
    setattr(cls, IGNORE_COMPILE_KEY, False)
    return cls


@mark_ignore_compile
class FlaggedLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def class_decorator_sets_a_flag_by_module_constant(model: FlaggedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def wrap_init(cls):
    old_init = cls.__init__

    def __init__(self, *args, **kwargs):
        old_init(self, *args, **kwargs)
        self.do_not_compile = True

    cls.__init__ = __init__
    return cls


@wrap_init
class WrappedInitLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        if not inp.has_stale_rows:
            self.last_ids = inp.host_tokens.ids  # fresh on this step only
        return self.logits(self.embed(self.last_ids), inp)


@entry_point
def class_decorator_wraps_init(model: WrappedInitLM, inp: ForwardInput) -> Tensor:
    model.step_ids = inp.host_tokens.ids if not inp.has_stale_rows else model.step_ids
    return model.logits(model.embed(model.step_ids), inp)


_FORWARD_CONTEXT: contextvars.ContextVar = contextvars.ContextVar("forward_context")


@contextlib.contextmanager
def forward_context(metadata: dict):
    token = _FORWARD_CONTEXT.set(metadata)
    try:
        yield
    finally:
        _FORWARD_CONTEXT.reset(token)


class Rope(nn.Module):
    def forward(self, positions: Tensor) -> Tensor:
        return positions.float()


_ROPE_CACHE: dict = {}


def get_rope(dim: int) -> Rope:
    if dim in _ROPE_CACHE:
        return _ROPE_CACHE[dim]
    rope = Rope()
    _ROPE_CACHE[dim] = rope
    return rope


class RotaryLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.rotary = get_rope(8)


@entry_point
def cached_rope_under_a_forward_context(model: RotaryLM, inp: ForwardInput) -> Tensor:
    with forward_context({"num_tokens": inp.num_tokens}):
        model.rotary(inp.positions)  # an object the checker cannot resolve, given no ids
        return model.logits(model.embed(inp.embedding_ids()), inp)
