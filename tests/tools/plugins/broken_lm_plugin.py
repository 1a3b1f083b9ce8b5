"""A deliberately broken model plugin: the bug vllm.cpp shipped, packaged as a third-party model.

Its forward embeds the host buffer with placeholders clamped to a valid id — read through the buffer's
private field, since ``placeholder_buffer()`` is refused to a forward on a spliced step — so nothing raises
and the async path produces fluent wrong tokens — while its factory declares
``honors_device_token_ids=True``. ``tokenstate verify --module broken_lm_plugin`` must fail: the
checker finds the host route, and the gate pinpoints the first stale row that diverged.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ForwardInput, entry_point
from tokenstate.runtime.kernels import guarded_embedding
from tokenstate.runtime.registry import ModelFactory, register


class BrokenLM(torch.nn.Module):
    """Embedding -> per-slot running state -> lm head: every token depends on the whole history."""

    def __init__(self, config: dict[str, Any], *, device: torch.device, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = config["vocab_size"]
        self.max_model_len = config["max_position_embeddings"]
        self.eos_token_id = None
        hidden = config["hidden_size"]
        self.embed = torch.nn.Parameter(torch.randn(self.vocab_size, hidden, generator=gen).to(device))
        self.mix = torch.nn.Parameter((torch.randn(hidden, hidden, generator=gen) / hidden**0.5).to(device))
        self.head = torch.nn.Parameter(torch.randn(hidden, self.vocab_size, generator=gen).to(device))
        self.state = torch.zeros(0, hidden, device=device)  # [num_slots, hidden]

    def allocate_slots(self, num_slots: int) -> None:
        self.state = torch.zeros(num_slots, self.mix.shape[0], device=self.mix.device)

    def reset_slot(self, slot: int) -> None:
        self.state[slot].zero_()


@entry_point
def clamped_host_forward(model: BrokenLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    ids = inp.host_tokens._ids.clamp(min=0)  # the silent bug: placeholder -> id 0
    hidden = guarded_embedding(ids, model.embed)  # [num_tokens, hidden]
    outs = torch.empty_like(hidden)  # [num_tokens, hidden]
    for row in inp.layout.rows:
        h = model.state[row.slot]  # [hidden]
        for t in range(row.start, row.end):
            h = torch.tanh(hidden[t] + h @ model.mix)
            outs[t] = h
        model.state[row.slot] = h
    return outs[inp.logits_indices] @ model.head  # [num_logits, vocab]


def build(config: dict[str, Any], *, device: torch.device, seed: int) -> BrokenLM:
    return BrokenLM(config, device=torch.device(device), seed=seed)


BROKEN = register(
    ModelFactory(
        architectures=("BrokenLM",),
        forward=clamped_host_forward,
        build=build,
        honors_device_token_ids=True,
        presets={"broken-lm": {"vocab_size": 64, "hidden_size": 16, "max_position_embeddings": 256}},
    )
)
