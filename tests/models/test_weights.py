"""HF-format checkpoints: round trips with HF, bad checkpoints and bad configs refused clearly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokenstate.contracts import ConfigError
from tokenstate.models import dense, llama

SMALL = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
}


def hf_model(config: dict):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_hf_save_our_load_our_save_hf_load_is_lossless(tied, tmp_path, hf_oracle):
    original = hf_model({**SMALL, "tie_word_embeddings": tied})
    original.save_pretrained(tmp_path / "hf")
    ours = llama.load(tmp_path / "hf", device="cpu")
    llama.save(ours, tmp_path / "ours")
    again = hf_oracle.load(tmp_path / "ours")
    want, got = original.state_dict(), again.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    saved = load_file(tmp_path / "ours" / "model.safetensors")
    assert ("lm_head.weight" in saved) is not tied  # HF's layout: a tied head is not stored
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) is tied


def test_sharded_checkpoint_loads(tmp_path):
    original = hf_model(SMALL)
    original.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = llama.load(tmp_path, device="cpu")
    assert torch.equal(ours.model.layers[1].mlp.down_proj.weight, original.model.layers[1].mlp.down_proj.weight)


def test_model_safetensors_is_the_model_beside_other_safetensors_files(tmp_path):
    """As HF loads it: an adapter or a consolidated copy next to model.safetensors is not merged in."""
    original = hf_model(SMALL)
    original.save_pretrained(tmp_path)
    save_file({"layers.0.attention.wq.weight": torch.zeros(4, 4)}, tmp_path / "consolidated.safetensors")
    ours = llama.load(tmp_path, device="cpu")
    assert torch.equal(ours.model.layers[1].mlp.down_proj.weight, original.model.layers[1].mlp.down_proj.weight)


def test_every_missing_unexpected_and_misshaped_tensor_is_listed_at_once(tmp_path):
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    del tensors["model.norm.weight"]
    tensors["model.layers.9.mlp.up_proj.weight"] = torch.zeros(2, 2)
    tensors["model.embed_tokens.weight"] = torch.zeros(127, 32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError) as info:
        llama.load(tmp_path, device="cpu")
    message = str(info.value)
    for expected in (
        "missing (2): model.layers.1.self_attn.k_proj.weight, model.norm.weight",
        "unexpected (1): model.layers.9.mlp.up_proj.weight",
        "model.embed_tokens.weight (checkpoint [127, 32], model [128, 32])",
    ):
        assert expected in message


def test_a_tied_head_that_differs_from_the_embedding_is_refused(tmp_path):
    model = llama.build({**SMALL, "tie_word_embeddings": True}, seed=0)
    llama.save(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = torch.ones(128, 32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        llama.load(tmp_path, device="cpu")


def test_pickle_only_checkpoint_is_refused_without_unpickling(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    torch.save({"model.norm.weight": torch.ones(32)}, tmp_path / "pytorch_model.bin")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load was called on a pickle checkpoint")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(ConfigError, match=r"pickle checkpoints found \(pytorch_model.bin\).*safetensors"):
        llama.load(tmp_path, device="cpu")


def test_missing_config_and_weights_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json"):
        llama.load(tmp_path, device="cpu")
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    with pytest.raises(ConfigError, match=r"no \*\.safetensors"):
        llama.load(tmp_path, device="cpu")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid UTF-8 JSON"):
        llama.load(tmp_path, device="cpu")


BAD_CONFIGS = {
    "negative size": ({"hidden_size": -64}, "hidden_size: must be >= 1"),
    "absurd vocab": ({"vocab_size": 10**9}, "vocab_size: must be <= 4194304"),
    "absurd total": (
        {"vocab_size": 2**22, "hidden_size": 2**16, "num_hidden_layers": 1024, "intermediate_size": 2**20},
        "parameters, beyond",
    ),
    "heads not dividing hidden": ({"num_attention_heads": 5}, "hidden_size=32 is not a multiple of num_attention_heads=5"),
    "kv heads not dividing heads": ({"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    "unknown field": ({"num_hidden_layer": 3}, "num_hidden_layer: unknown field"),
    "wrong type": ({"hidden_size": "32"}, "hidden_size: expected int, got str"),
    "bool as size": ({"num_hidden_layers": True}, "num_hidden_layers: expected int, got bool"),
    "unsupported rope": ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
    "rope theta not a number": ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, "rope_theta must be a number"),
    "rope theta null": ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, "rope_theta must be a number"),
    "legacy scaling beside rope_parameters": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        "rope_scaling rope_type 'llama3' is not supported",
    ),
    "top-level theta disagrees": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": 500000.0},
        "rope_theta=500000.0 (top level) disagrees with rope_parameters' rope_theta=10000.0",
    ),
    "unknown activation": ({"hidden_act": "swish42"}, "hidden_act 'swish42' is not supported"),
    "eos outside vocab": ({"eos_token_id": [2, 500]}, "eos_token_id: ids must lie in [0, vocab_size=128), got [2, 500]"),
    "wrong architecture": ({"architectures": ["MistralForCausalLM"]}, "serves LlamaForCausalLM"),
    "null size": ({"vocab_size": None}, "vocab_size: must not be null"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_refused_before_allocating(case, monkeypatch):
    changes, message = BAD_CONFIGS[case]

    def no_allocation(*args, **kwargs):
        raise AssertionError("a model was allocated for a config that should have been refused")

    monkeypatch.setattr(dense.DenseModel, "__init__", no_allocation)
    with pytest.raises(ConfigError, match=r"refused|serves") as info:
        llama.build({**SMALL, **changes}, device="cpu", seed=0)
    assert message in str(info.value)


def test_all_config_problems_are_reported_together():
    config = {**SMALL, "hidden_size": 0, "rms_norm_eps": "tiny", "typo_field": 1}
    del config["vocab_size"]
    with pytest.raises(ConfigError) as info:
        llama.build(config, seed=0)
    for problem in ("vocab_size: required", "hidden_size: must be >= 1", "rms_norm_eps: expected float", "typo_field"):
        assert problem in str(info.value)


def test_bookkeeping_fields_of_real_hf_configs_are_accepted(tmp_path):
    config = hf_model({**SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}}).config
    model = llama.build(json.loads(config.to_json_string()), seed=0)
    assert model.model.rotary.theta == 1234.0
    legacy = {**SMALL, "rope_theta": 777.0, "rope_scaling": None, "torch_dtype": "float32"}
    assert llama.build(legacy, seed=0).model.rotary.theta == 777.0


def test_half_precision_checkpoint_loads_exactly_into_float32(tmp_path):
    original = hf_model(SMALL).to(torch.bfloat16)
    original.save_pretrained(tmp_path / "bf16")
    ours = llama.load(tmp_path / "bf16", device="cpu")
    want = original.model.layers[0].self_attn.q_proj.weight
    got = ours.model.layers[0].self_attn.q_proj.weight
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    llama.save(ours, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["dtype"] == "float32"


def test_integer_and_bool_tensors_are_refused_not_cast(tmp_path):
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(32, dtype=torch.int64)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(64, 32, dtype=torch.bool)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"mis-typed \(2\): model.layers.0.mlp.up_proj.weight \(checkpoint BOOL, model float32\), model.norm.weight \(checkpoint I64"):
        llama.load(tmp_path, device="cpu")


def test_a_tensor_in_two_files_is_refused(tmp_path):
    """Without an index or a model.safetensors, every *.safetensors is read: none may repeat a tensor."""
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "part-a.safetensors")
    save_file({"model.norm.weight": torch.full((32,), 7.0)}, tmp_path / "zz-extra.safetensors")
    with pytest.raises(ConfigError, match=r"model.norm.weight is in both part-a.safetensors and zz-extra.safetensors"):
        llama.load(tmp_path, device="cpu")


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        (["model.safetensors"], "weight_map must map tensor names to shard file names"),
        ({"model.norm.weight": 3}, "weight_map must map tensor names to shard file names"),
        ({"model.norm.weight": "model.safetensors", "model.ghost.weight": "model.safetensors"},
         r"names tensors its shards do not hold: model.ghost.weight"),
    ],
)
def test_a_bad_shard_index_is_refused(tmp_path, weight_map, message):
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    if isinstance(weight_map, dict) and "model.ghost.weight" in weight_map:
        weight_map = {name: "model.safetensors" for name in load_file(tmp_path / "model.safetensors")} | weight_map
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ConfigError, match=message):
        llama.load(tmp_path, device="cpu")


def test_a_config_that_is_not_utf8_is_refused(tmp_path):
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{\x00}")
    with pytest.raises(ConfigError, match=r"config.json: not valid UTF-8 JSON"):
        llama.load(tmp_path, device="cpu")


def test_fields_of_published_checkpoints_that_change_nothing_are_accepted(tmp_path):
    """``auto_map`` (every checkpoint first published as remote code has one) names HF classes to
    import; it changes no weight and no computation. A stale ``rotary_emb.inv_freq`` buffer (old
    Llama conversions) is skipped, as HF skips it."""
    from safetensors.torch import save_file as write

    from tokenstate.models import kimi_linear, nemotron_h
    from tokenstate.models.kimi_linear_config import parse_kimi_linear_config
    from tokenstate.models.nemotron_h_config import parse_nemotron_h_config

    remote = {"auto_map": {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    llama.parse_config({**llama.PRESETS["tiny-llama"], **remote})
    parse_nemotron_h_config({**nemotron_h.TINY_NEMOTRON_H, **remote})
    parse_kimi_linear_config({**kimi_linear.TINY_KIMI_LINEAR, **remote})

    model = llama.build(dict(llama.PRESETS["tiny-llama"]), device="cpu", seed=0)
    llama.save(model, tmp_path)
    stale = load_file(tmp_path / "model.safetensors")
    stale["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    write(stale, tmp_path / "model.safetensors")
    again = llama.load(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


def test_weights_holding_nan_or_infinity_are_refused_naming_them(tmp_path):
    """A damaged checkpoint (NaN or infinite values) served garbage tokens (argmax of NaN logits is
    token 0) with no error: it is refused at load, naming each damaged tensor."""
    llama.save(llama.build(SMALL, seed=0), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.embed_tokens.weight"][3, 1] = float("nan")
    tensors["model.norm.weight"][0] = float("inf")
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=(
        r"NaN or infinite values.*model\.embed_tokens\.weight \(1 of \d+\), model\.norm\.weight \(1 of \d+\).*damaged"
    )):
        llama.load(tmp_path, device="cpu")
