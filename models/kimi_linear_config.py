"""Kimi-Linear config: HF ``KimiLinearConfig`` fields, validated before anything is allocated.

Accepts both spellings HF uses: the config-class names (``num_local_experts``,
``max_position_embeddings``, …) and the names ``save_pretrained`` writes to ``config.json``
(``num_experts``, ``model_max_length``, …), plus the original checkpoint's ``linear_attn_config``
block (1-indexed ``kda_layers`` / ``full_attn_layers``), ``first_k_dense_replace`` and the other
fields of the released checkpoint's own config class (``mla_use_nope``, ``moe_layer_freq``, …) at
the one value each that HF's modeling code computes. Refuses
absurd sizes, unknown layer types and inconsistent head counts in one ``ConfigError``.

``head_dim`` and ``qk_head_dim`` are derived, as HF's ``KimiLinearConfig.__post_init__`` derives
them (``qk_rope_head_dim`` and ``qk_nope_head_dim + qk_rope_head_dim``): HF ignores the stored
values, so a ``config.json`` whose stored values disagree loads here too, with a warning naming the
values used. ``tie_word_embeddings`` is ignored the same way: HF's ``KimiLinearForCausalLM`` ties
nothing and keeps its own ``lm_head.weight``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from tokenstate.contracts import ConfigError
from tokenstate.models.config import ConfigSchema, Field, special_token_rules
from tokenstate.models.layers import ACTIVATIONS

__all__ = ["ARCHITECTURE", "KimiLinearConfig", "parse_kimi_linear_config"]

ARCHITECTURE: Final = "KimiLinearForCausalLM"
KDA, MLA = "linear_attention", "full_attention"
DENSE, SPARSE = "dense", "sparse"

# config.json spelling (what HF's save_pretrained writes) -> config-class spelling.
_ALIASES: Final[dict[str, str]] = {
    "model_max_length": "max_position_embeddings",
    "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group",
    "num_experts": "num_local_experts",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
}
_INT, _OPT_INT, _FLOAT, _BOOL = (int,), (int, None), (float,), (bool,)

_SCHEMA: Final = ConfigSchema(
    model=ARCHITECTURE,
    fields=(
        Field("vocab_size", _INT, 163840, minimum=1, maximum=1 << 22),
        Field("hidden_size", _INT, 2304, minimum=1, maximum=1 << 16),
        Field("intermediate_size", _INT, 9216, minimum=1, maximum=1 << 20),
        Field("moe_intermediate_size", _INT, 1024, minimum=1, maximum=1 << 20),
        Field("num_hidden_layers", _INT, 27, minimum=1, maximum=1024),
        Field("num_attention_heads", _INT, 32, minimum=1, maximum=1024),
        Field("num_key_value_heads", _OPT_INT, None, minimum=1, maximum=1024),
        Field("kv_lora_rank", _INT, 512, minimum=1, maximum=1 << 16),
        Field("q_lora_rank", _OPT_INT, None, minimum=1, maximum=1 << 16),
        Field("qk_rope_head_dim", _INT, 64, minimum=0, maximum=4096),
        Field("qk_nope_head_dim", _INT, 128, minimum=0, maximum=4096),
        Field("v_head_dim", _INT, 128, minimum=1, maximum=4096),
        Field("attention_bias", _BOOL, False),
        Field("n_shared_experts", _INT, 1, minimum=0, maximum=64),
        Field("routed_scaling_factor", _FLOAT, 2.446, minimum=0.0, maximum=1e4),
        Field("n_group", _INT, 1, minimum=1, maximum=1024),
        Field("topk_group", _INT, 1, minimum=1, maximum=1024),
        Field("num_experts_per_tok", _INT, 8, minimum=1, maximum=1024),
        Field("num_local_experts", _INT, 256, minimum=1, maximum=4096),
        Field("norm_topk_prob", _BOOL, True),
        Field("hidden_act", (str,), "silu"),
        Field("max_position_embeddings", _INT, 1048576, minimum=1, maximum=1 << 24),
        Field("rms_norm_eps", _FLOAT, 1e-5, minimum=0.0, maximum=1.0),
        Field("tie_word_embeddings", _BOOL, False),
        Field("layer_types", (list, None), None),
        Field("mlp_layer_types", (list, None), None),
        Field("first_k_dense_replace", _INT, 1, minimum=0, maximum=1024),
        Field("linear_attn_config", (dict, None), None),
        Field("linear_head_dim", _INT, 128, minimum=1, maximum=4096),
        Field("linear_num_heads", _INT, 32, minimum=1, maximum=1024),
        Field("linear_conv_kernel_dim", _INT, 4, minimum=1, maximum=64),
        Field("pad_token_id", _OPT_INT, 163839),
        Field("bos_token_id", _OPT_INT, 163584),
        Field("eos_token_id", (int, list, None), 163586),
    ),
)

# Fields of the released checkpoint's own config class (Moonshot's configuration_kimi.py) that HF's
# KimiLinearConfig lacks and ignores: HF's modeling code (and ours) hard-codes one choice for each.
# That value is accepted; any other is refused by name, since neither implementation computes it.
_RELEASED_FIELDS: Final[dict[str, tuple[Any, str]]] = {
    "mla_use_nope": (True, "MLA layers without rotary embeddings (NoPE)"),
    "moe_layer_freq": (1, "a MoE on every layer from first_k_dense_replace on"),
    "moe_router_activation_func": ("sigmoid", "a sigmoid router"),
    "use_grouped_topk": (True, "grouped top-k routing (n_group, topk_group)"),
    "num_nextn_predict_layers": (0, "no multi-token-prediction layers"),
}
# Rotary settings of the released form: with NoPE MLA (above) nothing reads them.
_UNREAD_UNDER_NOPE: Final = ("rope_theta", "rope_scaling")


def _released_form_problems(values: dict[str, Any]) -> list[str]:
    """Pops the released form's fields from ``values``; a problem per value nothing computes."""
    for name in _UNREAD_UNDER_NOPE:
        values.pop(name, None)
    problems = []
    for name, (computed, meaning) in _RELEASED_FIELDS.items():
        if name in values and (value := values.pop(name)) != computed:
            if name == "use_grouped_topk" and values.get("n_group", 1) == 1:
                continue  # one group: grouped and plain top-k pick the same experts
            problems.append(
                f"{name}={value!r}: tokenstate, like HF's {ARCHITECTURE}, computes {meaning} only "
                f"({name}={computed!r})"
            )
    return problems


# Written by save_pretrained but derived on load, whatever was stored (see the module docstring).
_DERIVED: Final = ("head_dim", "qk_head_dim")

_MAX_PARAMETERS: Final = 200e9  # beyond this a config is a typo, not a model


@dataclass(frozen=True, slots=True)
class KimiLinearConfig:
    """Validated Kimi-Linear settings (HF config-class names; layer lists fully resolved)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    n_shared_experts: int
    routed_scaling_factor: float
    n_group: int
    topk_group: int
    num_experts_per_tok: int
    num_local_experts: int
    norm_topk_prob: bool
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]  # KDA ("linear_attention") or MLA ("full_attention") per layer
    mlp_layer_types: tuple[str, ...]  # "dense" or "sparse" (MoE) per layer
    linear_head_dim: int
    linear_num_heads: int
    linear_conv_kernel_dim: int
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that HF's ``KimiLinearConfig`` and :func:`parse_kimi_linear_config` read."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "eos_token_ids"}
        values["layer_types"] = list(self.layer_types)
        values["mlp_layer_types"] = list(self.mlp_layer_types)
        values["num_key_value_heads"] = self.num_attention_heads
        eos = list(self.eos_token_ids)
        values["eos_token_id"] = eos[0] if len(eos) == 1 else (eos or None)
        return {"architectures": [ARCHITECTURE], "model_type": "kimi_linear", **values}


def _normalise(config: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(config)
    for saved, canonical in _ALIASES.items():
        if saved in values:
            if canonical in values and values[canonical] != values[saved]:
                raise ConfigError(
                    f"{ARCHITECTURE} config refused before allocating anything: {saved!r} and "
                    f"{canonical!r} name the same setting but "
                    f"differ ({values[saved]!r} vs {values[canonical]!r}); keep only one."
                )
            values[canonical] = values.pop(saved)
    return values


def _resolve_linear_attn_config(values: dict[str, Any]) -> Iterable[str]:
    """Fold the original checkpoint's ``linear_attn_config`` block into the flat fields."""
    block = values.pop("linear_attn_config")
    if block is None:
        return
    for key, field in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                       ("short_conv_kernel_size", "linear_conv_kernel_dim")):
        if key in block:
            problem = Field(f"linear_attn_config.{key}", _INT, minimum=1, maximum=4096).check(block[key])
            if problem:
                yield problem
            else:
                values[field] = block[key]
    if values["layer_types"] is None and "kda_layers" in block and "full_attn_layers" in block:
        n = values["num_hidden_layers"]
        types: list[str | None] = [None] * n
        for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
            numbers = block[key]
            if not isinstance(numbers, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= n for i in numbers
            ):
                yield f"linear_attn_config.{key}: expected a list of layer numbers 1..{n}, got {numbers!r}"
                return
            for one_based in numbers:
                types[one_based - 1] = kind
        values["layer_types"] = types  # a layer listed in neither stays None and is refused below


def _rules(values: dict[str, Any]) -> Iterable[str]:
    problems = list(_resolve_linear_attn_config(values)) + list(_layer_rules(values))
    if problems:  # the remaining rules read the layer lists
        yield from problems
        return
    yield from _size_rules(values)


def _layer_rules(values: dict[str, Any]) -> Iterable[str]:
    n = values["num_hidden_layers"]
    if values["layer_types"] is None:  # HF's default pattern: MLA every fourth layer, from layer 4
        values["layer_types"] = [MLA if i and i % 4 == 0 else KDA for i in range(n)]
    if values["mlp_layer_types"] is None:
        values["mlp_layer_types"] = [DENSE if i < values["first_k_dense_replace"] else SPARSE for i in range(n)]
    for field, known in (("layer_types", (KDA, MLA)), ("mlp_layer_types", (DENSE, SPARSE))):
        types = values[field]
        if len(types) != n or any(t not in known for t in types):
            yield f"{field}: must list {n} entries (num_hidden_layers) from {list(known)}, got {types!r}"


def _size_rules(values: dict[str, Any]) -> Iterable[str]:
    kv_heads = values["num_key_value_heads"]
    if kv_heads is not None and kv_heads != values["num_attention_heads"]:
        yield (f"num_key_value_heads={kv_heads} must equal num_attention_heads="
               f"{values['num_attention_heads']}: MLA expands its latent into K/V for every head")
    rope, nope = values["qk_rope_head_dim"], values["qk_nope_head_dim"]
    if rope + nope < 1:
        yield "qk_rope_head_dim + qk_nope_head_dim must be >= 1"
    if values["hidden_act"] not in ACTIVATIONS:
        yield f"hidden_act: {values['hidden_act']!r} is not supported; use one of {sorted(ACTIVATIONS)}"
    if SPARSE in values["mlp_layer_types"]:
        experts, groups = values["num_local_experts"], values["n_group"]
        if experts % groups or experts // groups < 2:
            yield f"num_local_experts={experts} must split into n_group={groups} groups of >= 2 experts"
        elif values["topk_group"] > groups:
            yield f"topk_group={values['topk_group']} exceeds n_group={groups}"
        elif values["num_experts_per_tok"] > experts // groups * values["topk_group"]:
            yield (f"num_experts_per_tok={values['num_experts_per_tok']} exceeds the "
                   f"{experts // groups * values['topk_group']} experts in the topk_group kept groups")
    yield from special_token_rules(values)
    estimate = _parameter_estimate(values)
    if estimate > _MAX_PARAMETERS:
        yield f"the config describes ~{estimate:.3g} parameters (> {_MAX_PARAMETERS:.0e}); check its sizes"


def _parameter_estimate(v: Mapping[str, Any]) -> float:
    h = v["hidden_size"]
    inner = v["linear_num_heads"] * v["linear_head_dim"]
    heads, qk = v["num_attention_heads"], v["qk_rope_head_dim"] + v["qk_nope_head_dim"]
    mixer = {
        KDA: 4 * h * inner + 2 * (h + inner) * v["linear_head_dim"],
        MLA: h * heads * qk + h * v["kv_lora_rank"] + v["kv_lora_rank"] * heads * (qk + v["v_head_dim"])
        + heads * v["v_head_dim"] * h,
    }
    mlp = {
        DENSE: 3 * h * v["intermediate_size"],
        SPARSE: 3 * h * v["moe_intermediate_size"] * (v["num_local_experts"] + v["n_shared_experts"]),
    }
    layers = zip(v["layer_types"], v["mlp_layer_types"], strict=True)
    return 2.0 * v["vocab_size"] * h + sum(mixer[a] + mlp[m] for a, m in layers)


def _warn_on_ignored_derived(stored: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    rope, nope = values["qk_rope_head_dim"], values["qk_nope_head_dim"]
    derived = {"head_dim": rope, "qk_head_dim": rope + nope}
    ignored = [f"{name}={value!r} (using {derived[name]})" for name, value in stored.items()
               if value != derived[name]]
    if values["tie_word_embeddings"]:
        ignored.append("tie_word_embeddings=true (the LM head stays separate: lm_head.weight)")
    if ignored:
        warnings.warn(
            f"{ARCHITECTURE} config: ignoring the stored {', '.join(ignored)}; like HF, head_dim is "
            "qk_rope_head_dim, qk_head_dim is qk_nope_head_dim + qk_rope_head_dim and the LM head is "
            "never tied to the embedding.",
            UserWarning,
            stacklevel=3,
        )


def parse_kimi_linear_config(config: Mapping[str, Any]) -> KimiLinearConfig:
    """Validated settings from an HF-style config dict; raises ``ConfigError`` listing every problem."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{ARCHITECTURE}: a config must be a dict, got {type(config).__name__}.")
    normalised = _normalise(config)
    released = _released_form_problems(normalised)
    if released:
        raise ConfigError(
            f"{ARCHITECTURE} config refused before allocating anything: " + "; ".join(released)
            + ". Fix the config (config.json or the dict passed to build)."
        )
    stored = {name: normalised.pop(name) for name in _DERIVED if name in normalised}
    values = _SCHEMA.parse(normalised, checks=[_rules])
    _warn_on_ignored_derived(stored, values)
    eos = values.pop("eos_token_id")
    for derived in ("num_key_value_heads", "first_k_dense_replace"):
        values.pop(derived)
    values["layer_types"] = tuple(values["layer_types"])
    values["mlp_layer_types"] = tuple(values["mlp_layer_types"])
    values["routed_scaling_factor"] = float(values["routed_scaling_factor"])
    values["rms_norm_eps"] = float(values["rms_norm_eps"])
    return KimiLinearConfig(
        **values, eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    )
