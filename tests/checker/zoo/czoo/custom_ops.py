"""A custom op registered with ``torch.library`` (as vLLM's ``direct_register_custom_op`` registers
attention and MoE), called through ``torch.ops``: its Python implementation runs out of the
checker's sight, so ids the forward keeps where it may read them (a module-level buffer) make the
call an ``unknown`` route; a call that hands it nothing of the step's ids changes nothing.
"""

import torch
from torch import Tensor

from czoo.servable import HIDDEN, VOCAB, ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_KEPT_IDS: list = [torch.zeros(1, dtype=torch.long)]
_WEIGHT = torch.zeros(VOCAB, HIDDEN)
_LIBRARY = torch.library.Library("czoo_ops", "FRAGMENT")


def embed_kept(positions: Tensor) -> Tensor:
    return torch.nn.functional.embedding(_KEPT_IDS[0], _WEIGHT)


def scale_positions(positions: Tensor) -> Tensor:
    return positions * 1


def _register(name: str, impl) -> None:
    try:  # the zoo may be imported again in one process; torch's registry outlives the module
        _LIBRARY.define(f"{name}(Tensor positions) -> Tensor")
    except RuntimeError:
        return
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")


_register("embed_kept", embed_kept)
_register("scale_positions", scale_positions)


@entry_point
def a_custom_op_may_read_ids_kept_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is None:
        _KEPT_IDS[0] = inp.host_tokens.ids
    hidden = torch.ops.czoo_ops.embed_kept(inp.positions)
    return model.logits(hidden, inp)


@entry_point
def a_custom_op_given_nothing_of_the_ids(model: ServableLM, inp: ForwardInput) -> Tensor:
    torch.ops.czoo_ops.scale_positions(inp.positions)
    return model.logits(model.embed(inp.embedding_ids()), inp)


_STAGED = torch.zeros(4096, dtype=torch.long)  # [max_tokens]: a persistent input buffer


@entry_point
def a_custom_op_after_device_ids_were_staged(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    _STAGED[:n].copy_(inp.embedding_ids())  # the step's real ids, whatever the op reads there
    torch.ops.czoo_ops.scale_positions(inp.positions)
    return model.logits(model.embed(_STAGED[:n]), inp)
