"""Code that changes what runs without being called by name: decorators defined where they are
used, classes and managers as decorators, class-level patching, descriptors, dispatch, and
managers that swallow an exception on the way out.
"""

import contextlib
import functools

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class KernelUnavailable(RuntimeError):
    pass


def fused_embedding(model: ServableLM, ids: Tensor) -> Tensor:
    raise KernelUnavailable("no fused kernel on this machine")


# -- decorators where they stand -------------------------------------------------------------------


class Traced:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, model, inp):
        model.seen = int(inp.host_tokens.ids.numel())
        return self.fn(model, inp)


@Traced
def traced_run(model, inp):
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def class_as_a_decorator(model: ServableLM, inp: ForwardInput) -> Tensor:
    return traced_run(model, inp)


@entry_point
def decorator_defined_in_the_forward(model: ServableLM, inp: ForwardInput) -> Tensor:
    def spy(fn):
        def wrapper(ids):
            model.seen = int(inp.host_tokens.ids.numel())
            return fn(ids)

        return wrapper

    @spy
    def embed(ids):
        return model.embed(ids)

    return model.logits(embed(inp.embedding_ids()), inp)


class ClassBodyDecoratorLM(ServableLM):
    def _spy(fn):  # a decorator used in the class body
        def wrapper(self, inp):
            self.seen = int(inp.host_tokens.ids.numel())
            return fn(self, inp)

        return wrapper

    @_spy
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def decorator_defined_in_the_class_body(model: ClassBodyDecoratorLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@contextlib.contextmanager
def timed():
    yield


class TimedLM(ServableLM):
    @timed()
    def record(self):
        self.seen = int(self.step_input.host_tokens.ids.numel())

    def forward(self, inp: ForwardInput) -> Tensor:
        self.step_input = inp
        self.record()
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def context_manager_as_a_decorator(model: TimedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def log_tokens(fn):
    @functools.wraps(fn)
    def wrapper(model, inp):
        model.seen = int(inp.host_tokens.ids.numel())
        return fn(model, inp)

    return wrapper


@log_tokens
def embed_logged(model, inp):
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def wrapped_body_called_through_dunder_wrapped(model: ServableLM, inp: ForwardInput) -> Tensor:
    return embed_logged.__wrapped__(model, inp)  # the def's own body, without the logging


APPLY_AGAIN = False  # the checker does not evaluate the flag: both sides are possible


def itself(fn):
    if not APPLY_AGAIN:
        return fn

    @itself
    def again(model, inp):
        return fn(model, inp)

    return again


@entry_point
@itself
def decorator_that_applies_itself(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(inp.embedding_ids()), inp)


# -- class-level patching --------------------------------------------------------------------------


def debug_subclass(cls):
    class Debug(cls):
        def forward(self, inp):
            self.seen = int(inp.host_tokens.ids.numel())
            return super().forward(inp)

    return Debug


@debug_subclass
class SubclassedLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def class_decorator_returns_a_subclass(model: SubclassedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def _install(target, name, value):
    setattr(target, name, value)


def debug_by_helper(cls):
    inner = cls.forward

    def forward(self, inp):
        self.seen = int(inp.host_tokens.ids.numel())
        return inner(self, inp)

    _install(cls, "forward", forward)
    return cls


@debug_by_helper
class HelperPatchedLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def class_decorator_assigns_through_a_helper(model: HelperPatchedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class DebugOnSubclass(ServableLM):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        inner = cls.forward

        def forward(self, inp):
            self.seen = int(inp.host_tokens.ids.numel())
            return inner(self, inp)

        cls.forward = forward


class InitSubclassLM(DebugOnSubclass):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def init_subclass_assigns_forward(model: InitSubclassLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class Patching(type):
    def __new__(mcls, name, bases, namespace):
        inner = namespace.get("forward")
        if inner is not None:

            def forward(self, inp):
                self.seen = int(inp.host_tokens.ids.numel())
                return inner(self, inp)

            namespace["forward"] = forward
        return super().__new__(mcls, name, bases, namespace)


class MetaclassLM(ServableLM, metaclass=Patching):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def metaclass_rewrites_forward(model: MetaclassLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@(lambda cls: cls)
class LambdaDecoratedLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def class_decorator_that_returns_the_class(model: LambdaDecoratedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


# -- descriptors, dispatch, swallowing managers ------------------------------------------------------


class HostIdsDescriptor:
    def __get__(self, obj, owner=None):
        return obj.step_input.host_tokens.ids


class DescriptorLM(ServableLM):
    step_ids = HostIdsDescriptor()

    def forward(self, inp: ForwardInput) -> Tensor:
        self.step_input = inp
        return self.logits(self.embed(self.step_ids), inp)


@entry_point
def descriptor_reads_host_ids(model: DescriptorLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@functools.singledispatch
def ids_of(x):
    return x.embedding_ids()


@ids_of.register
def _(x: ForwardInput):
    return x.host_tokens.ids


@entry_point
def single_dispatch_picks_at_run_time(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(ids_of(inp)), inp)


@entry_point
def exit_stack_swallows_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.suppress(KernelUnavailable))
        return model.logits(fused_embedding(model, inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


class Quiet(contextlib.suppress):
    pass


@entry_point
def suppress_subclass_swallows_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    with Quiet(KernelUnavailable):
        return model.logits(fused_embedding(model, inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)


@contextlib.contextmanager
def tolerant():
    with contextlib.suppress(KernelUnavailable):
        yield


@entry_point
def manager_yielding_inside_suppress_then_host(model: ServableLM, inp: ForwardInput) -> Tensor:
    with tolerant():
        return model.logits(fused_embedding(model, inp.embedding_ids()), inp)
    return model.logits(model.embed(inp.host_tokens.ids), inp)
