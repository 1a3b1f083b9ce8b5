"""Python's own lookup rules, and spellings of a read that are not ``a.b``.

``x.__getattribute__("name")`` is ``x.name``; the last of two entries under one dict key wins; a
slice keeps only its items; a ``match`` pattern binds attributes, items and values of the subject;
``inp.has_stale_rows`` is a freshness test wherever it flows (a local, a helper's return, ``not``);
and a device-ids test kept on the model says nothing about the next call.
"""

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

FORCE_HOST = True


def embed_step(model: ServableLM, inp: ForwardInput, use_host: object) -> Tensor:
    ids = inp.host_tokens.ids if use_host else inp.embedding_ids()
    return model.logits(model.embed(ids), inp)


@entry_point
def getattribute_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.__getattribute__("host_tokens").ids
    return model.logits(model.embed(ids), inp)


@entry_point
def getattribute_raw_buffer(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = inp.host_tokens.__getattribute__("_ids")
    return model.logits(model.embed(ids), inp)


@entry_point
def duplicate_key_overrides_the_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    opts = {"use_host": inp.device_tokens is None, "use_host": FORCE_HOST}  # noqa: F601 — the last one wins
    return embed_step(model, inp, opts["use_host"])


@entry_point
def dict_keyword_overrides_the_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    opts = dict({"use_host": inp.device_tokens is None}, use_host=FORCE_HOST)
    return embed_step(model, inp, opts["use_host"])


@entry_point
def slice_of_flags_drops_the_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    flags = (inp.device_tokens is None, inp.device_tokens is not None)
    return embed_step(model, inp, flags[1:][0])


@entry_point
def slice_of_flags_keeps_the_guard(model: ServableLM, inp: ForwardInput) -> Tensor:
    flags = (inp.device_tokens is not None, inp.device_tokens is None)
    return embed_step(model, inp, flags[1:][0])


@entry_point
def match_keyword_capture_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    match inp:
        case ForwardInput(host_tokens=host):
            model.seen = int(host.ids.numel())
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def match_tuple_without_device_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    match (inp.device_tokens, inp.host_tokens):
        case (None, host):
            ids = host.ids
        case (device, _):
            ids = device.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def match_tuple_any_case_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    match (inp.device_tokens, inp.host_tokens):
        case (_, host):
            ids = host.ids
    return model.logits(model.embed(ids), inp)


def host_is_fresh(inp: ForwardInput) -> bool:
    return not inp.has_stale_rows


@entry_point
def no_stale_rows_by_a_helper(model: ServableLM, inp: ForwardInput) -> Tensor:
    if host_is_fresh(inp):
        return model.logits(model.embed(inp.host_tokens.ids), inp)
    return model.logits(model.embed(inp.embedding_ids()), inp)


@entry_point
def no_stale_rows_in_a_local(model: ServableLM, inp: ForwardInput) -> Tensor:
    fresh = not inp.host_tokens.has_stale
    ids = inp.host_tokens.ids if fresh else inp.embedding_ids()
    return model.logits(model.embed(ids), inp)


class FirstStepModeLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        if not hasattr(self, "host_fresh"):
            self.host_fresh = not inp.has_stale_rows  # decided on the first step, kept for the next
        ids = inp.host_tokens.ids if self.host_fresh else inp.embedding_ids()
        return self.logits(self.embed(ids), inp)


@entry_point
def freshness_test_kept_on_the_model(model: FirstStepModeLM, inp: ForwardInput) -> Tensor:
    return model(inp)
