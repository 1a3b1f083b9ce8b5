"""Step records built from the forward input the way engines build their metadata: dataclasses
with inherited fields, ``__post_init__`` and ``InitVar``, and ``typing.NamedTuple`` read by field,
by index and by unpacking.

A record holding the host tokens hands them to whatever reads its field: embedding them on a step
with spliced rows embeds placeholders, however the record was built.
"""

from dataclasses import InitVar, dataclass, field
from typing import NamedTuple

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


@dataclass
class StepMeta:
    positions: Tensor


@dataclass
class AttnMeta(StepMeta):
    tokens: object  # HostTokens or DeviceTokens


@dataclass
class DerivedMeta:
    inp: ForwardInput
    ids: Tensor | None = None

    def __post_init__(self) -> None:
        self.ids = self.inp.host_tokens.ids


@dataclass
class HonestDerivedMeta:
    inp: ForwardInput
    ids: Tensor | None = None

    def __post_init__(self) -> None:
        self.ids = self.inp.embedding_ids()


@dataclass
class DefaultedMeta:
    inp: ForwardInput
    tokens: object = None

    def __post_init__(self) -> None:
        if self.tokens is None:  # a default filled in: not a buffer created lazily
            self.tokens = self.inp.host_tokens


@dataclass
class InitVarMeta:
    inp: InitVar[ForwardInput]
    ids: Tensor = field(init=False)

    def __post_init__(self, inp: ForwardInput) -> None:
        self.ids = inp.host_tokens.ids


class PlainMeta(AttnMeta):
    """Not a dataclass itself: it inherits ``AttnMeta``'s generated ``__init__``."""


class TupleMeta(NamedTuple):
    positions: Tensor
    tokens: object


@entry_point
def inherited_dataclass_field_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = AttnMeta(inp.positions, inp.host_tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def inherited_dataclass_field_carries_device_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.host_tokens if inp.device_tokens is None else inp.device_tokens
    meta = AttnMeta(inp.positions, tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def post_init_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(DerivedMeta(inp).ids), inp)


@entry_point
def post_init_reads_embedding_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(HonestDerivedMeta(inp).ids), inp)


@entry_point
def init_var_post_init_reads_host_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(InitVarMeta(inp).ids), inp)


@entry_point
def named_tuple_field_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(inp.positions, inp.host_tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def named_tuple_keywords_carry_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(tokens=inp.host_tokens, positions=inp.positions)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def named_tuple_index_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(inp.positions, inp.host_tokens)
    return model.logits(model.embed(meta[1].ids), inp)


@entry_point
def named_tuple_unpacked_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    _, tokens = TupleMeta(inp.positions, inp.host_tokens)
    return model.logits(model.embed(tokens.ids), inp)


@entry_point
def named_tuple_carries_the_embedding_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(inp.positions, inp.host_tokens if inp.device_tokens is None else inp.device_tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def plain_subclass_of_a_dataclass_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = PlainMeta(inp.positions, inp.host_tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def post_init_default_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(DefaultedMeta(inp).tokens.ids), inp)


@entry_point
def named_tuple_iterated_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = None
    for part in TupleMeta(inp.positions, inp.host_tokens):
        tokens = part  # the last field: the tokens
    return model.logits(model.embed(tokens.ids), inp)


@entry_point
def named_tuple_listed_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = list(TupleMeta(inp.positions, inp.host_tokens))[1]
    return model.logits(model.embed(tokens.ids), inp)


@entry_point
def named_tuple_spread_into_a_call_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(_ids_of(*TupleMeta(inp.positions, inp.host_tokens))), inp)


@entry_point
def named_tuple_listed_carries_the_embedding_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.host_tokens if inp.device_tokens is None else inp.device_tokens
    return model.logits(model.embed(tuple(TupleMeta(inp.positions, tokens))[1].ids), inp)


def _ids_of(positions: Tensor, tokens: object) -> Tensor:
    return tokens.ids  # type: ignore[attr-defined]


@entry_point
def named_tuple_spread_into_a_list_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = [*TupleMeta(inp.positions, inp.host_tokens)][1]
    return model.logits(model.embed(tokens.ids), inp)


@entry_point
def named_tuple_as_a_dict_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    fields = TupleMeta(inp.positions, inp.host_tokens)._asdict()
    return model.logits(model.embed(fields["tokens"].ids), inp)


@entry_point
def named_tuple_replaced_field_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(inp.positions, None)._replace(tokens=inp.host_tokens)
    return model.logits(model.embed(meta.tokens.ids), inp)


@entry_point
def named_tuple_as_a_dict_carries_the_embedding_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.host_tokens if inp.device_tokens is None else inp.device_tokens
    return model.logits(model.embed(TupleMeta(inp.positions, tokens)._asdict()["tokens"].ids), inp)


@entry_point
def named_tuple_zipped_with_its_field_names_carries_host_tokens(model: ServableLM, inp: ForwardInput) -> Tensor:
    meta = TupleMeta(inp.positions, inp.host_tokens)
    fields = dict(zip(meta._fields, meta, strict=True))
    return model.logits(model.embed(fields["tokens"].ids), inp)


@entry_point
def named_tuple_zipped_with_its_field_names_carries_the_embedding_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    tokens = inp.host_tokens if inp.device_tokens is None else inp.device_tokens
    meta = TupleMeta(inp.positions, tokens)
    return model.logits(model.embed(dict(zip(meta._fields, meta, strict=True))["tokens"].ids), inp)
