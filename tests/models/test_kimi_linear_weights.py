"""Kimi-Linear HF-format weights and config validation.

Round trip: HF ``save_pretrained`` → our ``load`` → our ``save`` → HF ``from_pretrained`` gives the
identical tensors under the identical checkpoint names (per-expert ``w1/w2/w3``, split
``q/k/v_conv1d``, ``block_sparse_moe``). Bad configs are refused with one ``ConfigError`` before
anything is allocated.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tokenstate.contracts import ConfigError
from tokenstate.models.kimi_linear import TINY_KIMI_LINEAR, build, forward, load, save
from tokenstate.models.kimi_linear_config import parse_kimi_linear_config

transformers = pytest.importorskip("transformers")


def _hf_config(**overrides):
    values = {k: v for k, v in TINY_KIMI_LINEAR.items() if k != "architectures"}
    values.update(overrides)
    return transformers.KimiLinearConfig(**values)


def _names_and_shapes(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_hf_save_our_load_our_save_hf_load_is_identical(tmp_path, make_input, hf_oracle, q_lora_rank):
    torch.manual_seed(11)
    hf = transformers.KimiLinearForCausalLM(_hf_config(q_lora_rank=q_lora_rank)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load(tmp_path / "hf")
    save(ours, tmp_path / "ours")
    assert _names_and_shapes(tmp_path / "ours") == _names_and_shapes(tmp_path / "hf")
    back = hf_oracle.load(tmp_path / "ours")
    original, reloaded = hf.state_dict(), back.state_dict()
    assert original.keys() == reloaded.keys()
    for name, tensor in original.items():
        assert torch.equal(tensor, reloaded[name]), name
    # The loaded weights compute what HF computes.
    ours.allocate_slots(1)
    ids = list(range(5, 17))
    got = forward(ours, make_input([(0, ids)], vocab_size=ours.vocab_size, all_logits=True))
    torch.testing.assert_close(got, hf_oracle.logits(hf, ids), atol=1e-4, rtol=0)


def test_saved_config_reads_back_in_both_parsers(tmp_path):
    save(build(dict(TINY_KIMI_LINEAR)), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert parse_kimi_linear_config(written) == parse_kimi_linear_config(TINY_KIMI_LINEAR)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert list(hf.layer_types) == TINY_KIMI_LINEAR["layer_types"]
    assert list(hf.mlp_layer_types) == TINY_KIMI_LINEAR["mlp_layer_types"]
    assert hf.num_local_experts == TINY_KIMI_LINEAR["num_local_experts"]


def test_checkpoint_layout_spellings_resolve_like_hf():
    """The original checkpoint's ``linear_attn_config`` and save_pretrained's aliased names."""
    raw = {
        "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 2,
        "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "linear_attn_config": {"full_attn_layers": [2, 5], "kda_layers": [1, 3, 4], "head_dim": 8,
                               "num_heads": 2, "short_conv_kernel_size": 3},
        "first_k_dense_replace": 2, "num_experts": 4, "num_experts_per_token": 2,
        "num_shared_experts": 1, "moe_intermediate_size": 8, "model_max_length": 256,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": [2, 3],
    }
    ours = parse_kimi_linear_config(raw)
    hf = transformers.KimiLinearConfig(**raw)
    assert list(ours.layer_types) == list(hf.layer_types)
    assert list(ours.mlp_layer_types) == list(hf.mlp_layer_types)
    assert (ours.linear_head_dim, ours.linear_num_heads, ours.linear_conv_kernel_dim) == (8, 2, 3)
    assert (ours.num_local_experts, ours.num_experts_per_tok, ours.max_position_embeddings) == (4, 2, 256)
    assert ours.eos_token_ids == (2, 3)


BAD_CONFIGS = {
    "absurd vocab": ({"vocab_size": 1 << 30}, "vocab_size: must be <="),
    "absurd total size": ({"hidden_size": 60000, "intermediate_size": 900000, "num_hidden_layers": 1000,
                           "mlp_layer_types": None, "layer_types": None}, "parameters"),
    "unknown layer type": ({"layer_types": ["linear_attention", "mamba", "linear_attention",
                                            "full_attention"]}, "layer_types: must list 4 entries"),
    "too few layer types": ({"layer_types": ["linear_attention"]}, "layer_types: must list 4"),
    "unknown mlp type": ({"mlp_layer_types": ["dense", "moe", "dense", "dense"]}, "mlp_layer_types"),
    "kv heads differ": ({"num_key_value_heads": 2}, "num_key_value_heads=2 must equal"),
    "experts vs groups": ({"num_local_experts": 6, "n_group": 4}, "must split into n_group=4"),
    "top-k too large": ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 exceeds"),
    "typo": ({"num_hidden_layer": 4}, "num_hidden_layer: unknown field"),
    "alias conflict": ({"num_experts": 16}, "'num_experts' and 'num_local_experts'"),
    "bad kda layer list": ({"layer_types": None, "linear_attn_config": {"full_attn_layers": [9],
                                                                        "kda_layers": [1]}},
                           "layer numbers 1..4"),
    "eos outside vocab": ({"eos_token_id": 4000}, "eos_token_id"),
    "activation": ({"hidden_act": "swish7"}, "hidden_act"),
    "wrong type": ({"hidden_size": "64"}, "hidden_size: expected int"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_bad_configs_are_refused_before_allocating(name):
    overrides, message = BAD_CONFIGS[name]
    with pytest.raises(ConfigError, match="refused before allocating") as info:
        build({**TINY_KIMI_LINEAR, **overrides})
    assert message in str(info.value)


def test_checkpoint_not_matching_its_config_is_refused(tmp_path):
    save(build(dict(TINY_KIMI_LINEAR)), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_local_experts"] = 4  # the file holds 8 experts per MoE layer
    config["n_group"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"unexpected .*experts\.4\.w1\.weight"):
        load(tmp_path)
