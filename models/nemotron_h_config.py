"""NemotronH config: the HF ``NemotronHConfig`` fields, validated before anything is allocated.

Accepts what HF's ``config.json`` holds (``layers_block_type`` or the legacy
``hybrid_override_pattern`` string, the legacy ``mamba_*`` aliases, ``time_step_limit`` with an
infinite upper bound as JSON ``Infinity`` or HF's ``{"__float__": "Infinity"}``) and refuses
absurd sizes, unknown layer types and inconsistent head counts with one clear ``ConfigError``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Final

from tokenstate.contracts import ConfigError
from tokenstate.models.config import ConfigSchema, Field, divides, special_token_rules

__all__ = [
    "ARCHITECTURE",
    "LAYER_TYPES",
    "NEMOTRON_H_SCHEMA",
    "parameter_estimate",
    "parse_nemotron_h_config",
]

ARCHITECTURE: Final = "NemotronHForCausalLM"

LAYER_TYPES: Final[dict[str, str]] = {
    "M": "linear_attention",  # Mamba2 mixer
    "*": "full_attention",
    "-": "mlp",
    "E": "moe",
}

# Old layer-type names still found in checkpoints' config.json, mapped as HF's
# ``remap_legacy_layer_types`` maps them.
_LEGACY_LAYER_TYPES: Final[dict[str, str]] = {"mamba": "linear_attention", "attention": "full_attention"}

# Old HF names still found in checkpoints' config.json, mapped to the current ones.
_ALIASES: Final[dict[str, str]] = {
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_expand": "expand",
    "mamba_dt_min": "time_step_min",
    "mamba_dt_max": "time_step_max",
    "mamba_dt_limit": "time_step_limit",
    "mamba_dt_init_floor": "time_step_floor",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_chunk_size": "chunk_size",
}

_INT, _FLOAT, _BOOL = (int,), (float,), (bool,)
_OPT_INT = (int, None)

NEMOTRON_H_SCHEMA: Final = ConfigSchema(
    model=ARCHITECTURE,
    fields=(
        Field("vocab_size", _INT, minimum=1, maximum=1 << 22),
        Field("hidden_size", _INT, minimum=1, maximum=1 << 16),
        Field("layers_block_type", (list,)),
        Field("num_hidden_layers", _OPT_INT, None, minimum=1, maximum=1024),
        Field("tie_word_embeddings", _BOOL, False),
        Field("num_attention_heads", _INT, 32, minimum=1, maximum=1024),
        Field("num_key_value_heads", _OPT_INT, 8, minimum=1, maximum=1024),
        Field("head_dim", _INT, 128, minimum=1, maximum=1024),
        Field("max_position_embeddings", _INT, 4096, minimum=1, maximum=1 << 21),
        Field("attention_bias", _BOOL, False),
        Field("sliding_window", (int, None), None),
        Field("intermediate_size", _INT, 21504, minimum=1, maximum=1 << 20),
        Field("mlp_hidden_act", (str,), "relu2"),
        Field("mlp_bias", _BOOL, False),
        Field("use_mamba_kernels", _BOOL, True),
        Field("ssm_state_size", _INT, 128, minimum=1, maximum=1024),
        Field("mamba_num_heads", _INT, 128, minimum=1, maximum=4096),
        Field("mamba_head_dim", _INT, 64, minimum=1, maximum=1024),
        Field("mamba_hidden_act", (str,), "silu"),
        Field("n_groups", _INT, 8, minimum=1, maximum=1024),
        Field("conv_kernel", _INT, 4, minimum=1, maximum=64),
        Field("expand", _INT, 2, minimum=1, maximum=64),
        Field("time_step_min", _FLOAT, 0.001, minimum=0.0),
        Field("time_step_max", _FLOAT, 0.1, minimum=0.0),
        Field("time_step_limit", (list, tuple), (0.0, math.inf)),
        Field("time_step_floor", _FLOAT, 1e-4, minimum=0.0),
        Field("use_conv_bias", _BOOL, True),
        Field("chunk_size", _INT, 128, minimum=1, maximum=4096),
        Field("mamba_proj_bias", _BOOL, False),
        Field("mamba_ssm_cache_dtype", (str,), "float32"),
        Field("n_routed_experts", _INT, 8, minimum=1, maximum=1024),
        Field("n_shared_experts", _INT, 1, minimum=0, maximum=64),
        Field("moe_intermediate_size", _INT, 7688, minimum=1, maximum=1 << 20),
        Field("moe_shared_expert_intermediate_size", _INT, 7688, minimum=1, maximum=1 << 20),
        Field("moe_latent_size", _OPT_INT, None, minimum=1, maximum=1 << 16),
        Field("moe_shared_expert_overlap", _BOOL, True),
        Field("num_experts_per_tok", _INT, 2, minimum=1, maximum=1024),
        Field("routed_scaling_factor", _FLOAT, 1.0, minimum=0.0),
        Field("n_group", _INT, 1, minimum=1, maximum=1024),
        Field("topk_group", _INT, 1, minimum=1, maximum=1024),
        Field("norm_topk_prob", _BOOL, True),
        Field("num_nextn_predict_layers", _INT, 0, minimum=0, maximum=64),
        Field("mtp_layers_block_type", (list, None), None),
        Field("use_bias", _BOOL, False),
        Field("layer_norm_epsilon", _FLOAT, 1e-5, minimum=0.0, maximum=1.0),
        Field("residual_in_fp32", _BOOL, False),
        Field("hidden_dropout", _FLOAT, 0.0, minimum=0.0, maximum=0.0),
        Field("rescale_prenorm_residual", _BOOL, True),
        Field("num_logits_to_keep", _OPT_INT, 1),
        Field("pad_token_id", _OPT_INT, 0),
        Field("bos_token_id", _OPT_INT, 1),
        Field("eos_token_id", (int, list, None), 2),
    ),
)

_MAX_PARAMETERS: Final = 200e9  # beyond this a config is a typo, not a model


def _finite_or_inf(value: Any) -> Any:
    """HF writes ``inf`` as ``{"__float__": "Infinity"}``; Python's json as ``Infinity``."""
    if isinstance(value, Mapping) and value.get("__float__") in ("Infinity", "inf"):
        return math.inf
    return value


def _normalise(config: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(config)
    for old, new in _ALIASES.items():
        if old in values:
            if new in values and values[new] != values[old]:
                raise ConfigError(
                    f"{ARCHITECTURE} config: both {old!r} (legacy) and {new!r} are set, to different "
                    "values; keep only one."
                )
            values[new] = values.pop(old)
    # The MTP (multi-token-prediction) layers' pattern only describes checkpoint tensors that are
    # not loaded (see load_nemotron_h); it is checked like the main one all the same.
    for key, field in (("hybrid_override_pattern", "layers_block_type"), ("mtp_hybrid_override_pattern", "mtp_layers_block_type")):
        pattern = values.pop(key, None)
        if pattern is not None:
            if not isinstance(pattern, str) or any(ch not in LAYER_TYPES for ch in pattern):
                raise ConfigError(
                    f"{ARCHITECTURE} config: {key} {pattern!r} must be a string of "
                    f"{sorted(LAYER_TYPES)} (M=mamba, *=attention, -=mlp, E=moe)."
                )
            if values.get(field) is None:
                values[field] = [LAYER_TYPES[ch] for ch in pattern]
    for field in ("layers_block_type", "mtp_layers_block_type"):
        if isinstance(values.get(field), list):
            values[field] = [_LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in values[field]]
    if "time_step_limit" in values and isinstance(values["time_step_limit"], list | tuple):
        values["time_step_limit"] = [_finite_or_inf(v) for v in values["time_step_limit"]]
    return values


def _rules(values: dict[str, Any]) -> Iterable[str]:
    layers = values["layers_block_type"]
    known = sorted(LAYER_TYPES.values())
    if not layers or len(layers) > 1024 or any(t not in known for t in layers):
        yield f"layers_block_type: must list 1..1024 layer types from {known}, got {layers!r}"
        return
    mtp = values["mtp_layers_block_type"]
    if mtp is not None and (len(mtp) > 1024 or any(t not in known for t in mtp)):
        yield f"mtp_layers_block_type: must list layer types from {known}, got {mtp!r}"
    if values["num_hidden_layers"] not in (None, len(layers)):
        yield f"num_hidden_layers={values['num_hidden_layers']} disagrees with the {len(layers)} layers_block_type entries"
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    yield from divides("num_key_value_heads", "num_attention_heads")(values)
    yield from divides("n_groups", "mamba_num_heads")(values)
    limit = values["time_step_limit"]
    if not (
        len(limit) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in limit)
        and 0.0 <= limit[0] < limit[1]
    ):
        yield f"time_step_limit: expected [low, high] with 0 <= low < high, got {limit!r}"
    if values["mlp_hidden_act"] != "relu2":
        yield f"mlp_hidden_act: NemotronH uses 'relu2', got {values['mlp_hidden_act']!r}"
    if values["mamba_hidden_act"] != "silu":
        yield f"mamba_hidden_act: NemotronH uses 'silu', got {values['mamba_hidden_act']!r}"
    if values["attention_bias"]:
        yield "attention_bias: NemotronH attention has no biases (HF ignores the flag); set it to false"
    if values["sliding_window"] is not None:
        yield "sliding_window: not supported by NemotronH attention; set it to null"
    if "moe" in layers:
        experts, group = values["n_routed_experts"], values["n_group"]
        if experts % group or experts // group < 2:
            yield f"n_routed_experts={experts} must split into n_group={group} groups of >= 2 experts"
        if values["topk_group"] > group:
            yield f"topk_group={values['topk_group']} exceeds n_group={group}"
        if values["num_experts_per_tok"] > experts * values["topk_group"] // group:
            yield (
                f"num_experts_per_tok={values['num_experts_per_tok']} exceeds the "
                f"{experts * values['topk_group'] // group} experts of the topk_group selected groups"
            )
    eos = values["eos_token_id"]
    if isinstance(eos, list) and (not eos or not all(isinstance(e, int) for e in eos)):
        yield f"eos_token_id: a list must hold ints, got {eos!r}"
    else:
        yield from special_token_rules(values)
    estimate = parameter_estimate(values)
    if estimate > _MAX_PARAMETERS:
        yield f"the config describes ~{estimate:.3g} parameters (> {_MAX_PARAMETERS:.0e}); check its sizes"


def parameter_estimate(values: Mapping[str, Any]) -> int:
    """Rough parameter count of a parsed config (for the absurd-size check)."""
    h, total = values["hidden_size"], values["vocab_size"] * values["hidden_size"] * 2
    inner = values["mamba_num_heads"] * values["mamba_head_dim"]
    conv_dim = inner + 2 * values["n_groups"] * values["ssm_state_size"]
    heads, kv, hd = values["num_attention_heads"], values["num_key_value_heads"], values["head_dim"]
    latent = values["moe_latent_size"] or h
    per_layer = {
        "linear_attention": h * (inner + conv_dim + values["mamba_num_heads"]) + inner * h,
        "full_attention": 2 * h * heads * hd + 2 * h * kv * hd,
        "mlp": 2 * h * values["intermediate_size"],
        "moe": 2 * values["n_routed_experts"] * latent * values["moe_intermediate_size"]
        + 2 * h * values["moe_shared_expert_intermediate_size"],
    }
    return total + sum(per_layer[t] for t in values["layers_block_type"])


def parse_nemotron_h_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validated NemotronH settings (HF names, defaults filled in); raises ``ConfigError``."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{ARCHITECTURE}: a config must be a dict, got {type(config).__name__}.")
    values = NEMOTRON_H_SCHEMA.parse(_normalise(config), checks=[_rules])
    values["time_step_limit"] = (
        float(values["time_step_limit"][0]),
        float(values["time_step_limit"][1]),
    )
    if math.isfinite(values["time_step_limit"][1]) and any(t == "linear_attention" for t in values["layers_block_type"]):
        warnings.warn(
            f"{ARCHITECTURE} config: time_step_limit's upper bound {values['time_step_limit'][1]:g} is "
            "applied to the Mamba2 step size, as mamba_ssm's kernels apply it; HF transformers and vLLM "
            "ignore it (they clamp from below only), so their tokens differ from these.",
            UserWarning,
            stacklevel=3,
        )
    eos = values["eos_token_id"]
    values["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    if isinstance(eos, list):
        values["eos_token_id"] = eos[0] if eos else None
    return values
