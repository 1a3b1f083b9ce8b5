"""A tiny, real model for tests, tutorials and examples: :func:`toy_factory`.

``ToyLM`` is small enough to run thousands of steps a second on a CPU, yet real where it matters:
a guarded embedding, a per-slot history (each position's value is cached by slot and position,
like a KV cache) mixed with per-channel exponential decay so every output depends on the whole
history, a softsign, and an LM head. It follows the model ↔ runner contract (``allocate_slots``,
``reset_slot``, rows continue their slot where it left off — a gap raises), so a runner bug that
feeds the wrong tokens, the wrong slot or stale per-slot state changes its output.

Its arithmetic is *batch invariant*: each logit is a product-and-sum over a fixed-length axis
(hidden size, ``max_model_len``), never a matmul whose blocking could depend on the batch, so the
same request gives bit-identical logits whatever shares its step and however its prefill is
chunked. That is what lets tests demand async == sync token for token.

Four forwards differ only in which ids they embed, each a plain registered entry point (the
routing checker reads them statically):

* :func:`toy_forward` — ``inp.embedding_ids()``: correct on every path.
* :func:`toy_forward_host_ids` — ``inp.host_tokens.ids``: the original bug (it must not declare
  ``honors_device_token_ids=True``; if it does, the type state raises on the first async decode).
* :func:`toy_forward_placeholder_buffer` — the raw host buffer: refused to a running forward on
  a step with stale positions (``StaleHostTokensError``), as ``.ids`` is.
* :func:`toy_forward_private_buffer` — the buffer's private field, bypassing every check of the
  type state: the guarded embedding refuses the placeholders.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Float
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tokenstate.contracts import ConfigError, ContractViolation, ForwardInput, entry_point
from tokenstate.runtime.kernels import guarded_embedding
from tokenstate.runtime.registry import ModelFactory

__all__ = [
    "TOY_DEFAULTS",
    "ToyLM",
    "toy_factory",
    "toy_forward",
    "toy_forward_host_ids",
    "toy_forward_placeholder_buffer",
    "toy_forward_private_buffer",
]

TOY_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 16,
    "max_position_embeddings": 128,
    "eos_token_id": None,
}

_WEIGHTS = "model.safetensors"


def _config_int(config: dict[str, Any], key: str, minimum: int) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"ToyLM config: {key} must be an int >= {minimum}, got {value!r}.")
    return value


class ToyLM(nn.Module):
    """Embedding → decayed per-slot history mixer → softsign → LM head (see the module docstring)."""

    def __init__(self, config: dict[str, Any], *, device: torch.device, seed: int) -> None:
        super().__init__()
        self.config = dict(config)
        self.vocab_size = _config_int(config, "vocab_size", 2)
        self.hidden_size = _config_int(config, "hidden_size", 1)
        self.max_model_len = _config_int(config, "max_position_embeddings", 2)
        eos = config.get("eos_token_id")
        if eos is not None and not (isinstance(eos, int) and 0 <= eos < self.vocab_size):
            raise ConfigError(
                f"ToyLM config: eos_token_id must be None or in [0, {self.vocab_size}), got {eos!r}."
            )
        self.eos_token_id: int | None = eos
        gen = torch.Generator().manual_seed(seed)
        vocab, hidden = self.vocab_size, self.hidden_size
        self.embed = nn.Parameter(
            torch.randn(vocab, hidden, generator=gen), requires_grad=False
        )  # [vocab, hidden]
        # Decay in [0.85, 0.99]: long memory, and decay**max_len stays a normal float32.
        self.decay = nn.Parameter(
            0.85 + 0.14 * torch.rand(hidden, generator=gen), requires_grad=False
        )  # [hidden]
        self.lm_head = nn.Parameter(
            torch.randn(vocab, hidden, generator=gen) * (3.0 / math.sqrt(hidden)),
            requires_grad=False,
        )  # [vocab, hidden]
        self.to(device)
        self.history = torch.zeros(
            0, self.max_model_len, hidden, device=device
        )  # [num_slots, max_len, hidden]
        self.decay_powers = torch.zeros(
            0, hidden, device=device
        )  # [max_len, hidden], see allocate_slots
        self.filled: list[int] = []  # per slot: positions written so far (host bookkeeping)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def allocate_slots(self, num_slots: int) -> None:
        self.history = torch.zeros(
            num_slots, self.max_model_len, self.hidden_size, device=self.device
        )
        self.filled = [0] * num_slots
        # decay**distance, computed once (after any weight load) and gathered per step.
        distance = torch.arange(self.max_model_len, device=self.device).unsqueeze(1)  # [max_len, 1]
        self.decay_powers = self.decay.detach() ** distance  # [max_len, hidden]

    def reset_slot(self, slot: int) -> None:
        self.history[slot].zero_()
        self.filled[slot] = 0


def _mix_and_project(model: ToyLM, inp: ForwardInput, hidden: Tensor) -> Tensor:
    """``hidden`` ``[num_tokens, hidden]`` → logits ``[num_logits, vocab]`` (batch invariant)."""
    for row in inp.layout.rows:
        if row.num_computed > model.filled[row.slot]:
            raise ContractViolation(
                f"ToyLM: row {row.row} starts slot {row.slot} at position {row.num_computed} but only "
                f"{model.filled[row.slot]} positions were fed since the slot was reset; rows must "
                "continue their slot where it left off."
            )
        model.filled[row.slot] = row.seq_len
    layout = inp.layout
    max_len = model.max_model_len
    # Token slots come from the host layout, and every gather below is an index_select: torch's CPU
    # repeat_interleave and advanced indexing open a thread pool per call, which costs milliseconds
    # on a loaded machine.
    token_slots = torch.from_numpy(
        np.repeat(layout.slots.numpy().astype(np.int64), np.diff(layout.query_start_loc.numpy()))
    ).to(inp.device, non_blocking=True)  # [num_tokens] int64
    history = model.history.view(-1, model.hidden_size)  # [num_slots * max_len, hidden]
    history.index_copy_(0, token_slots * max_len + inp.positions, hidden)
    query_slots = token_slots.index_select(0, inp.logits_indices)  # [num_logits]
    query_pos = inp.positions.index_select(0, inp.logits_indices)  # [num_logits]
    past = model.history.index_select(0, query_slots)  # [num_logits, max_len, hidden]
    distance = query_pos.unsqueeze(1) - torch.arange(
        max_len, device=inp.device
    )  # [num_logits, max_len]
    weights = model.decay_powers.index_select(0, distance.clamp(min=0).flatten()).view(past.shape)
    weights = weights.masked_fill(
        (distance < 0).unsqueeze(2), 0.0
    )  # the future (or a stale past) never counts
    # Reduce over a contiguous last axis of fixed length: the same summation order for every row.
    summary = (past * weights).transpose(1, 2).contiguous().sum(dim=2)  # [num_logits, hidden]
    x = 4.0 * summary * (1.0 - model.decay) + hidden.index_select(
        0, inp.logits_indices
    )  # [num_logits, hidden]
    # Softsign, not tanh: only IEEE-exact operations, so SIMD and scalar tails agree bit for bit.
    mixed = x / (1.0 + x.abs())  # [num_logits, hidden]
    return (mixed.unsqueeze(1) * model.lm_head).sum(dim=2)  # [num_logits, vocab]


@entry_point
def toy_forward(model: ToyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    """Correct forward: embeds the device ids whenever the runner provides them."""
    hidden = guarded_embedding(inp.embedding_ids(), model.embed)  # [num_tokens, hidden]
    return _mix_and_project(model, inp, hidden)


@entry_point
def toy_forward_host_ids(model: ToyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    """The original bug: embeds the host ids even when the device holds the real ones."""
    hidden = guarded_embedding(
        inp.host_tokens.ids.to(model.device), model.embed
    )  # [num_tokens, hidden]
    return _mix_and_project(model, inp, hidden)


@entry_point
def toy_forward_placeholder_buffer(
    model: ToyLM, inp: ForwardInput
) -> Float[Tensor, "num_logits vocab"]:
    """Bypasses the type state: embeds the raw host buffer, placeholders included (refused: a
    forward reading ``placeholder_buffer()`` on a step with stale positions raises)."""
    raw = inp.host_tokens.placeholder_buffer()  # [num_tokens], PLACEHOLDER at stale positions
    hidden = guarded_embedding(raw.to(model.device), model.embed)  # [num_tokens, hidden]
    return _mix_and_project(model, inp, hidden)


@entry_point
def toy_forward_private_buffer(
    model: ToyLM, inp: ForwardInput
) -> Float[Tensor, "num_logits vocab"]:
    """Bypasses every check of the type state: embeds the private host buffer field, placeholders
    included; only the guarded embedding stops it."""
    raw = inp.host_tokens._ids  # [num_tokens], PLACEHOLDER at stale positions
    hidden = guarded_embedding(raw.to(model.device), model.embed)  # [num_tokens, hidden]
    return _mix_and_project(model, inp, hidden)


_FORWARDS = {
    "device": toy_forward,
    "host": toy_forward_host_ids,
    "raw": toy_forward_placeholder_buffer,
    "private": toy_forward_private_buffer,
}


def _build(config: dict[str, Any], *, device: torch.device | str, seed: int) -> ToyLM:
    return ToyLM(config, device=torch.device(device), seed=seed)


def _save(model: ToyLM, path: str | Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config, indent=2))
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        str(path / _WEIGHTS),
    )


def _load(path: str | Path, *, device: torch.device | str) -> ToyLM:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    model = ToyLM(config, device=torch.device(device), seed=0)
    model.load_state_dict(load_file(str(path / _WEIGHTS), device=str(device)))
    return model


def toy_factory(
    name: str = "ToyLM",
    *,
    honors: bool = True,
    embed: Literal["device", "host", "raw", "private"] = "device",
    vocab_size: int = TOY_DEFAULTS["vocab_size"],
    hidden_size: int = TOY_DEFAULTS["hidden_size"],
    max_model_len: int = TOY_DEFAULTS["max_position_embeddings"],
    eos_token_id: int | None = None,
    seed: int = 0,
) -> ModelFactory:
    """A :class:`ModelFactory` for ``ToyLM`` under architecture ``name``, with one preset.

    Args:
        name: architecture name (also the preset name, lower-cased).
        honors: the declared ``honors_device_token_ids``.
        embed: which forward: ``"device"`` (correct), ``"host"`` (the original bug), ``"raw"``
            (embeds the placeholder buffer) or ``"private"`` (embeds the buffer's private field).
        vocab_size: the preset's vocabulary size.
        hidden_size: the preset's hidden size.
        max_model_len: the preset's context length (``max_position_embeddings``).
        eos_token_id: the preset's EOS token, or ``None`` for none.
        seed: the preset's weight seed.
    """
    if embed not in _FORWARDS:
        raise ConfigError(f"toy_factory: embed must be one of {sorted(_FORWARDS)}, got {embed!r}.")
    config = {
        "architectures": [name],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "max_position_embeddings": max_model_len,
        "eos_token_id": eos_token_id,
    }
    return ModelFactory(
        architectures=(name,),
        forward=_FORWARDS[embed],
        build=_build,
        load=_load,
        save=_save,
        honors_device_token_ids=honors,
        presets={name.lower(): config},
        preset_seed=seed,
        # The history is indexed by position and rewritten in place, so rejected drafts roll back
        # by lowering num_computed.
        supports_speculative=True,
        name=name,
    )
