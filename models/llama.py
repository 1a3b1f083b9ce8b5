"""Llama (HF ``LlamaForCausalLM``): the shared dense decoder with Llama's config and weights.

Register with ``tokenstate.runtime.registry.register(FACTORY)``. The forward delegates to the
shared :class:`~tokenstate.models.dense.DenseModel`, whose ``embed`` reads the honoured ids
(``inp.embedding_ids()``: device ids whenever present) through the guarded embedding — hence
``honors_device_token_ids=True``. Attention caches are overwritten in place, so a rejected draft is
rolled back by the runner lowering ``num_computed``: ``supports_speculative=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ConfigError, ForwardInput, entry_point
from tokenstate.models.config import REQUIRED, ConfigSchema, Field, divides, special_token_rules
from tokenstate.models.dense import DenseConfig, DenseForCausalLM
from tokenstate.models.fused_linear import prepack
from tokenstate.models.layers import ACTIVATIONS
from tokenstate.models.step_plan import plan_model_indices
from tokenstate.models.weights import (
    load_state,
    read_config,
    safetensors_files,
    save_checkpoint,
    seeded_init,
)
from tokenstate.runtime.registry import ModelFactory

__all__ = ["FACTORY", "PRESETS", "LlamaForCausalLM", "build", "forward", "load", "parse_config", "save"]

ARCHITECTURE = "LlamaForCausalLM"
INIT_STD = 0.2
"""10x HF's ``initializer_range`` (0.02). At 0.02 — and often still at 0.1 with a tied head — a
tiny random model collapses into repeating one token, and parity on such outputs proves little."""
MAX_PARAMETERS = 2 * 10**10
"""Configs beyond this are refused as absurd for a reference implementation (before allocating)."""

_SIZE = (int,)
SCHEMA = ConfigSchema(
    ARCHITECTURE,
    (
        Field("vocab_size", _SIZE, REQUIRED, 1, 2**22),
        Field("hidden_size", _SIZE, REQUIRED, 1, 2**16),
        Field("intermediate_size", _SIZE, REQUIRED, 1, 2**20),
        Field("num_hidden_layers", _SIZE, REQUIRED, 1, 1024),
        Field("num_attention_heads", _SIZE, REQUIRED, 1, 1024),
        Field("num_key_value_heads", (int, None), None, 1, 1024),
        Field("head_dim", (int, None), None, 2, 1024),
        Field("hidden_act", (str,), "silu"),
        Field("max_position_embeddings", _SIZE, 2048, 1, 2**21),
        Field("rms_norm_eps", (float,), 1e-6, 1e-12, 1.0),
        Field("rope_parameters", (dict, None), None),
        Field("rope_theta", (float, None), None, 1.0, 1e12),  # pre-5.0 configs
        Field("rope_scaling", (dict, None), None),  # pre-5.0 configs
        Field("attention_bias", (bool,), False),
        Field("mlp_bias", (bool,), False),
        Field("tie_word_embeddings", (bool,), False),
        Field("bos_token_id", (int, None), 1, 0),
        Field("eos_token_id", (int, list, None), 2),
        Field("pad_token_id", (int, None), None, 0),
    ),
)


def _rope_theta(values: dict[str, Any]) -> tuple[float, list[str]]:
    """Base frequency from ``rope_parameters`` (or the legacy top-level fields); problems listed.

    Every field that says something about the rotary embedding is read: a scaling named by the
    legacy ``rope_scaling`` next to ``rope_parameters``, or a top-level ``rope_theta`` that
    disagrees with ``rope_parameters``' own, is a problem, never silently dropped."""
    problems = []
    for field_name in ("rope_parameters", "rope_scaling"):
        given = values[field_name] or {}
        kind = given.get("rope_type", given.get("type", "default"))
        if kind != "default":
            problems.append(f"{field_name} rope_type {kind!r} is not supported (only 'default' rotary embeddings)")
    params = dict(values["rope_parameters"] or values["rope_scaling"] or {})
    params.pop("rope_type", None)
    params.pop("type", None)
    top = values["rope_theta"]
    theta = params.pop("rope_theta", top if top is not None else 10000.0)
    if top is not None and theta != top:
        problems.append(f"rope_theta={top!r} (top level) disagrees with rope_parameters' rope_theta={theta!r}; keep one")
    if params:
        problems.append(f"rope_parameters has unsupported keys {sorted(params)}")
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 1.0 <= theta <= 1e12:
        problems.append(f"rope_theta must be a number in [1, 1e12], got {theta!r}")
        return 10000.0, problems  # never used: the problems refuse the config
    return float(theta), problems


def _eos_ids(values: dict[str, Any]) -> tuple[int, ...]:
    eos = values["eos_token_id"]
    return () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)


def _llama_rules(values: dict[str, Any]) -> list[str]:
    problems = []
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if hidden % heads:
        problems.append(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    head_dim = values["head_dim"] or hidden // heads
    if head_dim % 2:
        problems.append(f"head_dim={head_dim} must be even for rotary embeddings")
    if values["hidden_act"] not in ACTIVATIONS:
        problems.append(f"hidden_act {values['hidden_act']!r} is not supported; use one of {sorted(ACTIVATIONS)}")
    problems += _rope_theta(values)[1]
    vocab = values["vocab_size"]
    kv_heads = values["num_key_value_heads"] or heads
    layers, inter = values["num_hidden_layers"], values["intermediate_size"]
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inter
    total = layers * per_layer + vocab * hidden * (1 if values["tie_word_embeddings"] else 2)
    if total > MAX_PARAMETERS:
        problems.append(f"about {total:.3g} parameters, beyond the {MAX_PARAMETERS:.0g} this reference model serves")
    return problems


def parse_config(config: dict[str, Any]) -> tuple[DenseConfig, dict[str, Any]]:
    """Validate an HF Llama config; return the dense config and the normalised HF dict to save."""
    if not isinstance(config, dict):
        raise ConfigError(f"{ARCHITECTURE}: config must be a dict, got {type(config).__name__}.")
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or ARCHITECTURE not in archs):
        raise ConfigError(f"config names architectures {archs!r}; this factory serves {ARCHITECTURE}.")
    values = SCHEMA.parse(config, checks=[divides("num_key_value_heads", "num_attention_heads"), special_token_rules, _llama_rules])
    heads = values["num_attention_heads"]
    dense = DenseConfig(
        vocab_size=values["vocab_size"],
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_hidden_layers=values["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=values["num_key_value_heads"] or heads,
        head_dim=values["head_dim"] or values["hidden_size"] // heads,
        max_position_embeddings=values["max_position_embeddings"],
        rms_norm_eps=float(values["rms_norm_eps"]),
        rope_theta=_rope_theta(values)[0],
        hidden_act=values["hidden_act"],
        attention_bias=values["attention_bias"],
        mlp_bias=values["mlp_bias"],
        tie_word_embeddings=values["tie_word_embeddings"],
        eos_token_id=(_eos_ids(values) or (None,))[0],
    )
    normalised = {k: v for k, v in values.items() if k not in ("rope_theta", "rope_scaling")}
    normalised.update(
        architectures=[ARCHITECTURE], model_type="llama", dtype="float32",
        num_key_value_heads=dense.num_key_value_heads, head_dim=dense.head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": dense.rope_theta},
    )
    return dense, normalised


class LlamaForCausalLM(DenseForCausalLM):
    """HF ``LlamaForCausalLM`` parameters and math, float32, per-slot KV caches."""

    def __init__(self, config: dict[str, Any]) -> None:
        dense, normalised = parse_config(config)
        super().__init__(dense, normalised)
        self.eos_token_ids: tuple[int, ...] = _eos_ids(normalised)

    def tied_aliases(self) -> dict[str, str]:
        """Checkpoint names that alias another tensor (HF omits a tied LM head)."""
        return {"lm_head.weight": "model.embed_tokens.weight"} if self.model.config.tie_word_embeddings else {}


@entry_point
def forward(model: LlamaForCausalLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    """Float32 logits ``[num_logits, vocab]`` at ``inp.logits_indices`` (embeds ``inp.embedding_ids()``)."""
    with torch.no_grad():
        return model.compute_logits(inp)


def _construct(config: dict[str, Any], device: torch.device | str) -> LlamaForCausalLM:
    parse_config(config)  # refuse a bad config before a single tensor exists
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.requires_grad_(False).eval()


def build(config: dict[str, Any], *, device: torch.device | str = "cpu", seed: int = 0) -> LlamaForCausalLM:
    """A Llama with deterministic random weights (same seed → same weights on every device)."""
    model = _construct(config, device)
    seeded_init(model, seed, INIT_STD)
    return prepack(model)


def load(path: str | Path, *, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """Load an HF-format directory (config.json + safetensors; pickle checkpoints are refused)."""
    config = read_config(path)
    parse_config(config)
    safetensors_files(path)  # refuse pickle-only / empty directories before allocating
    model = _construct(config, device)
    load_state(model, path, aliases=model.tied_aliases(), model=ARCHITECTURE)
    return prepack(model)


def save(model: LlamaForCausalLM, path: str | Path) -> None:
    """Write config.json + model.safetensors that HF ``LlamaForCausalLM.from_pretrained`` loads."""
    save_checkpoint(model, path, model.hf_config, aliases=model.tied_aliases())


_TINY = {
    "architectures": [ARCHITECTURE],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-llama": _TINY,
    "tiny-llama-gqa": {
        **_TINY,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "tie_word_embeddings": True,
    },
}

FACTORY = ModelFactory(
    architectures=(ARCHITECTURE,),
    forward=forward,
    build=build,
    load=load,
    save=save,
    honors_device_token_ids=True,
    presets=PRESETS,
    preset_seed=0,
    supports_speculative=True,
    plan_indices=plan_model_indices,
    name="llama",
)
