"""A Kimi-Linear config.json that HF loads, loads here: the stored derived head sizes are derived."""

from __future__ import annotations

import json

import pytest
import torch

from tokenstate.contracts import ConfigError
from tokenstate.models.kimi_linear import TINY_KIMI_LINEAR, build, load, save
from tokenstate.models.kimi_linear_config import parse_kimi_linear_config

transformers = pytest.importorskip("transformers")

TINY = {k: v for k, v in TINY_KIMI_LINEAR.items() if k != "architectures"}


def _hf_saved(tmp_path, **stored):
    """What HF's save_pretrained writes, with ``stored`` values edited into the file afterwards."""
    transformers.KimiLinearConfig(**TINY).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(stored)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return config


def test_hf_save_pretrained_config_parses_without_a_warning(tmp_path, recwarn):
    config = _hf_saved(tmp_path)
    assert (config["head_dim"], config["qk_head_dim"]) == (8, 24)  # HF writes its derived values
    ours = parse_kimi_linear_config(config)
    assert (ours.qk_rope_head_dim, ours.qk_nope_head_dim) == (TINY["qk_rope_head_dim"], TINY["qk_nope_head_dim"])
    assert not recwarn.list


def test_stored_head_dims_that_hf_ignores_are_derived_with_a_warning(tmp_path):
    config = _hf_saved(tmp_path, head_dim=16, qk_head_dim=99)
    # HF's modeling code derives the head sizes from qk_rope/qk_nope_head_dim and never reads the
    # stored values: the same weights, and it runs.
    hf = transformers.KimiLinearForCausalLM(transformers.AutoConfig.from_pretrained(tmp_path))
    clean = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**TINY))
    shapes = {name: tuple(p.shape) for name, p in hf.state_dict().items()}
    assert shapes == {name: tuple(p.shape) for name, p in clean.state_dict().items()}
    assert hf(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, TINY["vocab_size"])
    with pytest.warns(UserWarning, match=r"^KimiLinearForCausalLM config: ignoring the stored head_dim=16 "
                      r"\(using 8\), qk_head_dim=99 \(using 24\); like HF, head_dim is qk_rope_head_dim"):
        ours = parse_kimi_linear_config(config)
    assert ours == parse_kimi_linear_config({**TINY, "architectures": ["KimiLinearForCausalLM"]})


def test_a_model_dir_with_hf_ignored_head_dims_loads_and_matches(tmp_path):
    model = build(dict(TINY_KIMI_LINEAR))
    save(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 16}))
    with pytest.warns(UserWarning, match="ignoring the stored head_dim=16"):
        loaded = load(tmp_path)
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name


def test_what_hf_cannot_run_is_still_refused():
    # HF builds K/V for every head and then repeats them num_heads // num_kv_heads times: a
    # different count fails inside its attention, so it is refused here up front.
    with pytest.raises(ConfigError, match=r"num_key_value_heads=2 must equal num_attention_heads=4"):
        parse_kimi_linear_config({**TINY, "num_key_value_heads": 2})


def test_tie_word_embeddings_is_ignored_as_hf_ignores_it(tmp_path):
    hf = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**TINY, tie_word_embeddings=True))
    assert hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr()  # HF ties nothing
    with pytest.warns(UserWarning, match=r"ignoring the stored tie_word_embeddings=true \(the LM head stays "
                      r"separate: lm_head\.weight\).*never tied to the embedding"):
        ours = parse_kimi_linear_config({**TINY, "tie_word_embeddings": True})
    assert ours.tie_word_embeddings is True


# The fields of Moonshot's released config.json (configuration_kimi.py) that HF's KimiLinearConfig
# does not have, at the values HF's modeling code (and ours) computes.
_RELEASED_FORM = {
    "mla_use_nope": True, "moe_layer_freq": 1, "moe_router_activation_func": "sigmoid",
    "use_grouped_topk": True, "num_nextn_predict_layers": 0, "rope_theta": 10000.0, "rope_scaling": None,
}  # fmt: skip


def test_the_released_config_form_parses_as_hf_reads_it(tmp_path, recwarn):
    config = _hf_saved(tmp_path, **_RELEASED_FORM)
    assert parse_kimi_linear_config(config) == parse_kimi_linear_config(_hf_saved(tmp_path))
    one_group = _hf_saved(tmp_path, **{**_RELEASED_FORM, "use_grouped_topk": False, "num_expert_group": 1})
    assert parse_kimi_linear_config(one_group).n_group == 1  # one group: grouped and plain top-k agree
    assert not recwarn.list


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mla_use_nope", False, r"mla_use_nope=False: .*MLA layers without rotary embeddings \(NoPE\)"),
        ("moe_layer_freq", 2, r"moe_layer_freq=2: .*a MoE on every layer from first_k_dense_replace on"),
        ("moe_router_activation_func", "softmax", r"moe_router_activation_func='softmax': .*sigmoid"),
        ("num_nextn_predict_layers", 1, r"num_nextn_predict_layers=1: .*no multi-token-prediction layers"),
        ("use_grouped_topk", False, r"use_grouped_topk=False: .*grouped top-k routing"),
    ],
)
def test_released_fields_that_change_the_math_are_refused_by_name(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_kimi_linear_config(_hf_saved(tmp_path, **{**_RELEASED_FORM, field: value}))
