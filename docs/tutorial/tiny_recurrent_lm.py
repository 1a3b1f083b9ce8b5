"""The tutorial's model: a tiny recurrent language model that learns to honour device token ids.

The tutorial page (docs/tutorial/index.md) includes the sections of this file between the
``--8<--`` markers, and tests/docs/test_tutorial.py runs every step, so the page never shows code
that was not executed.
"""

# --8<-- [start:imports]
from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput, entry_point
from tokenstate.runtime import LLM, EngineStats, ModelFactory, SamplingParams, register, unregister
from tokenstate.runtime.kernels import guarded_embedding

# --8<-- [end:imports]


# --8<-- [start:model]
class TinyRecurrentLM(nn.Module):
    """Embedding → a decaying per-slot recurrent state → LM head."""

    def __init__(self, config: dict[str, Any], *, device: torch.device, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size: int = config["vocab_size"]
        self.max_model_len: int = config["max_position_embeddings"]
        self.eos_token_id: int | None = None
        hidden = config["hidden_size"]
        # Both [vocab, hidden]: token embeddings and the LM head.
        self.embed = nn.Parameter(torch.randn(self.vocab_size, hidden, generator=gen))
        self.lm_head = nn.Parameter(torch.randn(self.vocab_size, hidden, generator=gen))
        self.decay = 0.7
        self.to(device)
        self.state = torch.zeros(0, hidden, device=device)  # [num_slots, hidden]

    # The runner calls these two: per-request state is indexed by slot, never by batch row.
    def allocate_slots(self, num_slots: int) -> None:
        self.state = torch.zeros(num_slots, self.embed.shape[1], device=self.embed.device)

    def reset_slot(self, slot: int) -> None:
        self.state[slot].zero_()


def recur_and_project(model: TinyRecurrentLM, inp: ForwardInput, hidden: Tensor) -> Tensor:
    """``hidden`` ``[num_tokens, hidden]`` → logits ``[num_logits, vocab]``; each row continues its slot."""
    out = torch.empty_like(hidden)  # [num_tokens, hidden]
    for row in inp.layout.rows:
        state = model.state[row.slot]  # [hidden]
        for t in range(row.start, row.end):
            state = model.decay * state + hidden[t]
            out[t] = state
        model.state[row.slot] = state
    return torch.tanh(out[inp.logits_indices]) @ model.lm_head.T  # [num_logits, vocab]


def build(config: dict[str, Any], *, device: torch.device, seed: int) -> TinyRecurrentLM:
    return TinyRecurrentLM(config, device=device, seed=seed)


CONFIG = {"vocab_size": 64, "hidden_size": 16, "max_position_embeddings": 64}
# --8<-- [end:model]


# --8<-- [start:naive]
@entry_point
def forward_host_ids(
    model: TinyRecurrentLM, inp: ForwardInput
) -> Float[Tensor, "num_logits vocab"]:
    ids = inp.host_tokens.ids.to(model.embed.device)  # [num_tokens] — the host's view of the batch
    return recur_and_project(model, inp, guarded_embedding(ids, model.embed))


naive = ModelFactory(
    architectures=("TinyRecurrentLM",),
    forward=forward_host_ids,
    build=build,
    presets={"tiny-recurrent": CONFIG},
)  # honors_device_token_ids defaults to False
# --8<-- [end:naive]


# --8<-- [start:generate]
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
GREEDY = SamplingParams(max_tokens=8)


def generate(
    factory: ModelFactory, *, async_scheduling: bool, **engine: Any
) -> tuple[list[tuple[int, ...]], EngineStats]:
    """Greedy tokens for PROMPTS, and the engine's step counters."""
    llm = LLM(factory, async_scheduling=async_scheduling, **engine)
    outputs = llm.generate(PROMPTS, GREEDY)
    return [out.token_ids for out in outputs], llm.stats


# --8<-- [end:generate]


# --8<-- [start:run]
def compare_paths(factory: ModelFactory, **engine: Any) -> EngineStats:
    """Run PROMPTS synchronously, then asynchronously; the tokens must be the same."""
    sync_tokens, _ = generate(factory, async_scheduling=False)
    async_tokens, stats = generate(factory, async_scheduling=True, **engine)
    assert async_tokens == sync_tokens, "the asynchronous engine diverged"
    return stats


# stats = compare_paths(naive)  ->  stats.async_steps == 1, stats.fallback_steps == 7
# compare_paths(naive, on_unhonored="refuse")  ->  raises ContractViolation
# --8<-- [end:run]


# --8<-- [start:lying]
lying = ModelFactory(
    architectures=("TinyRecurrentLM",),
    forward=forward_host_ids,
    build=build,
    presets={"tiny-recurrent": CONFIG},
    honors_device_token_ids=True,  # a promise the forward does not keep
)
# --8<-- [end:lying]


# --8<-- [start:fixed]
@entry_point
def forward(model: TinyRecurrentLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    ids = inp.embedding_ids()  # [num_tokens] — device ids whenever the runner provides them
    return recur_and_project(model, inp, guarded_embedding(ids, model.embed))


honouring = ModelFactory(
    architectures=("TinyRecurrentLM",),
    forward=forward,
    build=build,
    presets={"tiny-recurrent": CONFIG},
    honors_device_token_ids=True,
)
# --8<-- [end:fixed]


# --8<-- [start:register]
def generate_by_name() -> list[tuple[int, ...]]:
    register(honouring)
    try:
        llm = LLM("tiny-recurrent", async_scheduling=True)
        return [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]
    finally:
        unregister(honouring)


# --8<-- [end:register]
