"""Code a forward hands to something that runs it later or elsewhere: a thread pool, a thread, a
forward pre-hook reading the module's arguments, a method bound by hand, a class patched after its
body. What runs out of sight is `unknown` when it can reach the step's ids — through its arguments
or through what it closes over; what the checker can follow is followed.
"""

import collections
import concurrent.futures
import gc
import threading
import types

from torch import Tensor

from czoo.servable import ServableLM, build_servable
from tokenstate.contracts import ForwardInput, entry_point

_POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="czoo-handoffs")


@entry_point
def pool_job_closes_over_the_input(model: ServableLM, inp: ForwardInput) -> Tensor:
    hidden = _POOL.submit(lambda: model.embed(inp.host_tokens.ids)).result()
    return model.logits(hidden, inp)


@entry_point
def pool_job_reads_the_raw_buffer(model: ServableLM, inp: ForwardInput) -> Tensor:
    raw = _POOL.submit(lambda: inp.host_tokens.placeholder_buffer()).result()
    return model.logits(model.embed(raw), inp)


@entry_point
def thread_target_closes_over_the_input(model: ServableLM, inp: ForwardInput) -> Tensor:
    out: list[Tensor] = []
    worker = threading.Thread(target=lambda: out.append(model.embed(inp.host_tokens.ids)))
    worker.start()
    worker.join()
    return model.logits(out[0], inp)


@entry_point
def pool_job_without_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    width = _POOL.submit(lambda: model.weight.shape[1]).result()  # plain metadata off the thread
    hidden = model.embed(inp.embedding_ids())
    return model.logits(hidden[:, :width], inp)


def _rows_of(inp: ForwardInput) -> int:
    return inp.num_rows


def _host_hidden(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.embed(inp.host_tokens.ids)


def _device_hidden(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.embed(inp.embedding_ids())


def _device_hidden_into(model: ServableLM, inp: ForwardInput, out: list[Tensor]) -> None:
    out.append(model.embed(inp.embedding_ids()))


@entry_point
def pool_job_given_the_input_reads_metadata(model: ServableLM, inp: ForwardInput) -> Tensor:
    rows = _POOL.submit(_rows_of, inp).result()  # a job handed the input is the call it is
    hidden = model.embed(inp.embedding_ids())
    return model.logits(hidden * (rows > 0), inp)


@entry_point
def pool_job_given_the_input_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    hidden = _POOL.submit(_host_hidden, model, inp=inp).result()
    return model.logits(hidden, inp)


@entry_point
def pool_map_over_inputs_embeds_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    (hidden,) = _POOL.map(_device_hidden, [model], [inp])
    return model.logits(hidden, inp)


@entry_point
def thread_given_the_input_embeds_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    out: list[Tensor] = []
    worker = threading.Thread(target=_device_hidden_into, args=(model, inp, out))
    worker.start()
    worker.join()
    return model.logits(out[0], inp)


class ArgsPreHookLM(ServableLM):
    """A pre-hook registered at construction that reads the step's input from the module's args."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.register_forward_pre_hook(lambda module, args: (args[0], args[0].host_tokens.ids))

    def forward(self, inp: ForwardInput, ids: Tensor | None = None) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids() if ids is None else ids), inp)


@entry_point
def pre_hook_reads_the_input_from_its_args(model: ArgsPreHookLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class TokenSourceLM(ServableLM):
    def token_ids(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.token_ids(inp)), inp)


def _host_token_ids(self, inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


def build_method_bound_by_hand(config: dict, *, device, seed: int) -> TokenSourceLM:
    model = TokenSourceLM(config).to(device)
    model.token_ids = types.MethodType(_host_token_ids, model)
    return model


@entry_point
def method_bound_by_hand_in_build(model: TokenSourceLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class PatchedAfterItsBodyLM(TokenSourceLM):
    pass


PatchedAfterItsBodyLM.token_ids = _host_token_ids


@entry_point
def class_patched_after_its_body(model: PatchedAfterItsBodyLM, inp: ForwardInput) -> Tensor:
    return model(inp)


__all__ = ["build_servable"]


# -- state kept on the model from one step to the next ---------------------------------------------


class KeepsTheStepLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.previous_tokens = None  # the host tokens of the step before
        self.previous_input = None

    def previous_ids(self):
        return None if self.previous_tokens is None else self.previous_tokens.ids


@entry_point
def host_tokens_kept_for_the_next_step(model: KeepsTheStepLM, inp: ForwardInput) -> Tensor:
    previous = model.previous_ids()  # last step's host ids: stale wherever its rows were
    model.previous_tokens = inp.host_tokens
    hidden = model.embed(inp.embedding_ids())
    if previous is not None:
        hidden = hidden + 0.0 * model.embed(previous[:1])
    return model.logits(hidden, inp)


@entry_point
def input_kept_for_the_next_step(model: KeepsTheStepLM, inp: ForwardInput) -> Tensor:
    previous = model.previous_input
    model.previous_input = inp
    hidden = model.embed(inp.embedding_ids())
    if previous is not None:
        hidden = hidden + 0.0 * model.embed(previous.host_tokens.ids[:1])
    return model.logits(hidden, inp)


@entry_point
def device_ids_kept_for_the_next_step(model: KeepsTheStepLM, inp: ForwardInput) -> Tensor:
    previous = model.previous_input  # here: last step's device-or-fresh ids
    model.previous_input = inp.embedding_ids()
    hidden = model.embed(inp.embedding_ids())
    if previous is not None:
        hidden = hidden + 0.0 * model.embed(previous[:1])
    return model.logits(hidden, inp)


# -- code given as text ----------------------------------------------------------------------------


@entry_point
def eval_reads_the_input_from_the_locals(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = eval("inp.host_tokens.ids")  # the text reads the caller's locals
    return model.logits(model.embed(ids), inp)


# -- tokens handed over by raising or sending them --------------------------------------------------


class CarriesTheTokens(Exception):
    pass


@entry_point
def exception_carries_the_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    try:
        raise CarriesTheTokens(inp.host_tokens)
    except CarriesTheTokens as carried:
        ids = carried.args[0].ids
    return model.logits(model.embed(ids), inp)


def _token_reader():
    tokens = yield None
    while True:
        tokens = yield tokens.ids


_READER = _token_reader()
next(_READER)


@entry_point
def host_tokens_sent_into_a_generator(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = _READER.send(inp.host_tokens)
    return model.logits(model.embed(ids), inp)


class StagesItsIdsLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.step_ids = None

    def forward(self, inp: ForwardInput) -> Tensor:
        if inp.device_tokens is None:  # every path stages this step's ids before reading them
            self.step_ids = inp.host_tokens.ids
        else:
            self.step_ids = inp.device_tokens.ids
        return self.logits(self.embed(self.step_ids), inp)


@entry_point
def ids_staged_on_the_model_on_every_path(model: StagesItsIdsLM, inp: ForwardInput) -> Tensor:
    return model(inp)


# -- the raw buffer through introspection ----------------------------------------------------------


@entry_point
def raw_buffer_through_getstate(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.__getstate__()[1]["_ids"]  # the slots' state: the raw buffer, placeholders in
    return model.logits(model.embed(ids), inp)


# -- hooks over containers the forward fills -------------------------------------------------------


class BoxedHookLM(ServableLM):
    """A pre-hook closing over a dict that the forward fills with the step's host tokens."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        box: dict = {}
        self.box = box
        self.register_forward_pre_hook(lambda module, args: (args[0], box["tokens"].ids))

    def forward(self, inp: ForwardInput, ids: Tensor | None = None) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids() if ids is None else ids), inp)


@entry_point
def hook_reads_a_box_the_forward_fills(model: BoxedHookLM, inp: ForwardInput) -> Tensor:
    model.box["tokens"] = inp.host_tokens
    return model(inp)


class TimedLM(ServableLM):
    """A pre-hook closing over a stats dict it only writes timings into."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        stats: dict = {}
        self.stats = stats
        self.register_forward_pre_hook(lambda module, args: stats.update(calls=stats.get("calls", 0) + 1))

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def hook_counts_calls_into_a_dict(model: TimedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class GcHookLM(ServableLM):
    """A pre-hook that finds the raw buffer among the objects the host tokens the forward puts in
    its dict refer to."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        box: dict = {}
        self.box = box
        self.register_forward_pre_hook(
            lambda module, args: (args[0], next(o for o in gc.get_referents(box["tokens"]) if isinstance(o, Tensor)))
        )

    def forward(self, inp: ForwardInput, ids: Tensor | None = None) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids() if ids is None else ids), inp)


@entry_point
def hook_hands_the_tokens_to_gc(model: GcHookLM, inp: ForwardInput) -> Tensor:
    model.box["tokens"] = inp.host_tokens
    return model(inp)


_RECENT_INPUTS: collections.deque = collections.deque(maxlen=2)


class RecordingLM(ServableLM):
    """A pre-hook that only stores what it is given in a collector (transformers' output capture)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.register_forward_pre_hook(lambda module, args: _RECENT_INPUTS.append(args[0]))

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


@entry_point
def hook_stores_its_arguments_in_a_collector(model: RecordingLM, inp: ForwardInput) -> Tensor:
    return model(inp)
