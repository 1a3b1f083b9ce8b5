"""NemotronH against the HF oracle (``NemotronHForCausalLM``, transformers' torch path on the CPU).

HF's CPU path falls back to its reference torch implementations (``mamba_chunk_scan_combined`` for
prompts, ``selective_state_update`` for single tokens) when mamba_ssm / causal_conv1d are absent.
That prompt path clamps dt at ``time_step_min`` while the single-token path does not; we follow
``time_step_limit`` in both, so the parity configs set ``time_step_min=0`` to make HF agree with
itself (see the preset's comment).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from tokenstate.contracts import ConfigError, ContractViolation
from tokenstate.models.nemotron_h import (
    NEMOTRON_H_FACTORY,
    TINY_NEMOTRON_H,
    build_nemotron_h,
    load_nemotron_h,
    nemotron_h_forward,
    save_nemotron_h,
)

VOCAB = 256

# A second layout: attention first, tied head, biases, latent MoE with grouped routing, 8-token scan
# chunks, four B/C groups.
OTHER_CONFIG: dict[str, Any] = {
    **TINY_NEMOTRON_H,
    "layers_block_type": ["full_attention", "linear_attention", "moe", "linear_attention", "mlp"],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "n_groups": 4,
    "chunk_size": 8,
    "use_bias": True,
    "mlp_bias": True,
    "use_conv_bias": False,
    "tie_word_embeddings": True,
    "n_routed_experts": 6,
    "n_group": 2,
    "topk_group": 1,
    "moe_latent_size": 32,
    "routed_scaling_factor": 1.5,
}
CONFIGS = {"preset": dict(TINY_NEMOTRON_H), "other": OTHER_CONFIG}


def _prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (length,), generator=g).tolist()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory, hf_oracle):
    """(our model, the HF model loaded from our save) for each config."""
    ours = build_nemotron_h(CONFIGS[request.param], seed=7)
    path = tmp_path_factory.mktemp(f"nemotron_h_{request.param}")
    save_nemotron_h(ours, path)
    return ours, hf_oracle.load(path)


def test_batched_prefill_and_decode_match_hf(pair, make_input, hf_oracle):
    ours, hf = pair
    ours.allocate_slots(4)
    prompts = {2: _prompt(1, 40), 0: _prompt(2, 17), 3: _prompt(3, 5)}  # slot -> prompt
    for slot in prompts:
        ours.reset_slot(slot)
    rows = [(slot, p) for slot, p in prompts.items()]
    logits = nemotron_h_forward(ours, make_input(rows, vocab_size=VOCAB, all_logits=True))
    offset = 0
    for p in prompts.values():
        expected = hf_oracle.logits(hf, p)
        assert (logits[offset : offset + len(p)] - expected).abs().max().item() <= 1e-4
        offset += len(p)
    # Four decode steps, all three slots batched together; ids chosen so sequences diverge.
    seqs = {slot: list(p) for slot, p in prompts.items()}
    decoded: dict[int, list[torch.Tensor]] = {slot: [] for slot in prompts}
    for step in range(4):
        rows = []
        for slot, seq in seqs.items():
            seq.append((seq[-1] * 31 + slot + step) % (VOCAB - 3) + 3)
            rows.append((slot, [seq[-1]], len(seq) - 1))
        logits = nemotron_h_forward(ours, make_input(rows, vocab_size=VOCAB))
        for i, slot in enumerate(seqs):
            decoded[slot].append(logits[i])
    for slot, seq in seqs.items():
        expected = hf_oracle.logits(hf, seq)[-4:]  # one HF forward covers every decode step
        assert (torch.stack(decoded[slot]) - expected).abs().max().item() <= 1e-4


def test_chunked_prefill_equals_one_step(make_input):
    model = build_nemotron_h(TINY_NEMOTRON_H, seed=3)
    model.allocate_slots(3)
    prompt = _prompt(4, 45)  # 45 > 2 * chunk_size: the scan crosses chunk borders in both halves
    whole = nemotron_h_forward(model, make_input([(1, prompt)], vocab_size=VOCAB, all_logits=True))
    model.reset_slot(1)
    other = _prompt(5, 9)
    # Step 1: first 19 tokens of slot 1 next to another request's prefill; step 2: the rest next
    # to that request's decode token.
    first = nemotron_h_forward(
        model, make_input([(0, other), (1, prompt[:19])], vocab_size=VOCAB, all_logits=True)
    )
    second = nemotron_h_forward(
        model, make_input([(1, prompt[19:], 19), (0, [7], 9)], vocab_size=VOCAB, all_logits=True)
    )
    chunked = torch.cat([first[len(other) :], second[: len(prompt) - 19]])
    assert (chunked - whole).abs().max().item() <= 1e-5


def test_slots_are_isolated_and_reset(make_input):
    model = build_nemotron_h(TINY_NEMOTRON_H, seed=3)
    model.allocate_slots(3)
    a, b = _prompt(6, 12), _prompt(7, 20)
    alone = nemotron_h_forward(model, make_input([(0, a)], vocab_size=VOCAB))
    # Slot 2 runs (prefill then decode) while slot 0 sits; slot 0's next token must not notice.
    nemotron_h_forward(model, make_input([(2, b)], vocab_size=VOCAB))
    nemotron_h_forward(model, make_input([(2, [5], 20)], vocab_size=VOCAB))
    after = nemotron_h_forward(model, make_input([(0, [9], 12)], vocab_size=VOCAB))
    model.reset_slot(1)
    nemotron_h_forward(model, make_input([(1, a)], vocab_size=VOCAB))
    twin = nemotron_h_forward(model, make_input([(1, [9], 12)], vocab_size=VOCAB))
    torch.testing.assert_close(after, twin, rtol=0, atol=1e-5)
    # Reusing slot 2 after a reset gives exactly a fresh request's logits.
    model.reset_slot(2)
    reused = nemotron_h_forward(model, make_input([(2, a)], vocab_size=VOCAB))
    torch.testing.assert_close(reused, alone, rtol=0, atol=1e-5)


def test_device_ids_are_embedded_through_the_scope(make_input):
    model = build_nemotron_h(TINY_NEMOTRON_H, seed=3)
    model.allocate_slots(2)
    prompt = _prompt(8, 10)
    nemotron_h_forward(model, make_input([(0, prompt[:-1]), (1, prompt[:-1])], vocab_size=VOCAB))
    fresh = nemotron_h_forward(model, make_input([(0, prompt[-1:], 9)], vocab_size=VOCAB))
    # Slot 1 gets the same token as a spliced row: PLACEHOLDER on the host, the id on the device.
    spliced = make_input([(1, prompt[-1:], 9)], vocab_size=VOCAB, stale_last=True)
    torch.testing.assert_close(nemotron_h_forward(model, spliced), fresh, rtol=0, atol=1e-6)
    with pytest.raises(ContractViolation, match="no StepScope is open"):
        model.compute_logits(spliced)  # bypassing the registered forward: no scope, no ids


def test_factory_declares_honoured_ids_and_builds_preset_deterministically():
    assert NEMOTRON_H_FACTORY.honors_device_token_ids is True
    assert NEMOTRON_H_FACTORY.supports_speculative is True  # recurrent state rolls back by checkpoint
    a = NEMOTRON_H_FACTORY.build_preset("tiny-nemotron-h")
    b = NEMOTRON_H_FACTORY.build_preset("tiny-nemotron-h")
    assert a.vocab_size == VOCAB and a.max_model_len >= 512 and a.eos_token_id == 2
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_greedy_decoding_does_not_collapse(make_input):
    """The scaled init must give a model whose greedy output varies (not the last token repeated)."""
    model = NEMOTRON_H_FACTORY.build_preset("tiny-nemotron-h")
    model.allocate_slots(1)
    seq = _prompt(9, 8)
    logits = nemotron_h_forward(model, make_input([(0, seq)], vocab_size=VOCAB))
    for _ in range(32):
        seq.append(int(logits[0].argmax()))
        logits = nemotron_h_forward(
            model, make_input([(0, seq[-1:], len(seq) - 1)], vocab_size=VOCAB)
        )
    generated = seq[8:]
    assert len(set(generated)) >= 8, generated


def test_hf_weights_round_trip(tmp_path):
    """HF save_pretrained -> our load -> our save -> HF load gives back the identical tensors."""
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.NemotronHConfig(
        **{k: v for k, v in TINY_NEMOTRON_H.items() if k != "time_step_min"}
    )
    torch.manual_seed(0)
    original = transformers.NemotronHForCausalLM(hf_config).eval()
    original.save_pretrained(tmp_path / "hf")
    ours = load_nemotron_h(tmp_path / "hf")
    save_nemotron_h(ours, tmp_path / "ours")
    reloaded = transformers.NemotronHForCausalLM.from_pretrained(
        tmp_path / "ours", dtype=torch.float32
    )
    want, got = original.state_dict(), reloaded.state_dict()
    assert sorted(want) == sorted(got)
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers_block_type": ["linear_attention", "sliding_attention"]}, "layers_block_type"),
        ({"hybrid_override_pattern": "M*X", "layers_block_type": None}, "hybrid_override_pattern"),
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"mamba_num_heads": 6, "n_groups": 4}, "n_groups=4"),
        ({"vocab_size": 1 << 30}, "vocab_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_hidden_layers": 7}, "num_hidden_layers=7"),
        ({"mlp_hidden_act": "silu"}, "relu2"),
        ({"n_routed_experts": 3, "n_group": 2}, "n_group=2"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok=9"),
        ({"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
        ({"num_atention_heads": 4}, "unknown field"),
        ({"mamba_n_groups": 4, "n_groups": 2}, "mamba_n_groups"),
        ({"eos_token_id": 1_000_000}, r"eos_token_id: ids must lie in \[0, vocab_size="),
        ({"eos_token_id": -1}, r"eos_token_id: ids must lie in"),
        ({"bos_token_id": -1}, r"bos_token_id=-1 lies outside the vocabulary"),
        ({"pad_token_id": 1_000_000}, r"pad_token_id=1000000 lies outside the vocabulary"),
    ],
)
def test_bad_configs_are_refused_before_allocation(change, message):
    config = {k: v for k, v in {**TINY_NEMOTRON_H, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        build_nemotron_h(config, seed=0)


def test_legacy_config_spellings_are_accepted():
    config = {
        k: v for k, v in TINY_NEMOTRON_H.items() if k not in ("layers_block_type", "n_groups")
    }
    config.update(
        hybrid_override_pattern="M-*ME",
        mamba_n_groups=2,
        time_step_limit=[0.0, {"__float__": "Infinity"}],
    )
    model = build_nemotron_h(config, seed=0)
    assert [b.layer_type for b in model.backbone.layers] == TINY_NEMOTRON_H["layers_block_type"]


def test_checkpoint_that_does_not_match_its_config_is_refused(tmp_path):
    save_nemotron_h(build_nemotron_h(TINY_NEMOTRON_H, seed=0), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["ssm_state_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="mis-shaped"):
        load_nemotron_h(tmp_path)


def test_routing_checker_sees_through_the_scope():
    """Statically: the forward reaches the guarded embedding only via the scope's device ids."""
    from tokenstate.checker import EntryTarget, Verdict, check_entry_points

    forward = NEMOTRON_H_FACTORY.forward.__wrapped__
    target = EntryTarget(
        "nemotron-h",
        forward.__module__,
        forward.__qualname__,
        NEMOTRON_H_FACTORY.honors_device_token_ids,
        build_nemotron_h.__module__,
        build_nemotron_h.__qualname__,
    )
    (result,) = check_entry_points([target]).results
    assert result.verdict is Verdict.HONORS, result
    assert any("scope" in hop.file for route in result.routes for hop in route.hops)


def test_forward_before_allocate_slots_is_refused(make_input):
    model = build_nemotron_h(TINY_NEMOTRON_H, seed=0)
    with pytest.raises(ConfigError, match="allocate_slots"):
        nemotron_h_forward(model, make_input([(0, [5, 6])], vocab_size=VOCAB))
    model.allocate_slots(1)
    with pytest.raises(ContractViolation, match="outside the 1 allocated slots"):
        nemotron_h_forward(model, make_input([(1, [5, 6])], vocab_size=VOCAB))


def test_a_tied_config_whose_checkpoint_holds_its_own_head_loads_that_head(tmp_path):
    """HF's NemotronH never ties its LM head (it declares no tied weights), so a checkpoint saying
    ``tie_word_embeddings=true`` yet holding a different ``lm_head.weight`` is served with that
    head — with a warning, not refused."""
    from safetensors.torch import load_file, save_file

    from tokenstate.models.nemotron_h import build_nemotron_h, load_nemotron_h, save_nemotron_h

    model = build_nemotron_h(dict(OTHER_CONFIG), device="cpu", seed=3)
    save_nemotron_h(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    head = torch.randn(tensors["lm_head.weight"].shape, generator=torch.Generator().manual_seed(5))
    save_file({**tensors, "lm_head.weight": head}, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match=r"tie_word_embeddings=true is ignored.*lm_head.weight"):
        loaded = load_nemotron_h(tmp_path)
    assert torch.equal(loaded.lm_head.weight, head)
    assert torch.equal(loaded.backbone.embeddings.weight, tensors["backbone.embeddings.weight"])


def test_legacy_layer_type_names_are_mapped_as_hf_maps_them():
    """Older NemotronH configs name layers ``mamba`` and ``attention``; HF remaps them."""
    names = {"linear_attention": "mamba", "full_attention": "attention"}
    config = {**TINY_NEMOTRON_H, "layers_block_type": [names.get(t, t) for t in TINY_NEMOTRON_H["layers_block_type"]]}
    model = build_nemotron_h(config, seed=0)
    assert [b.layer_type for b in model.backbone.layers] == TINY_NEMOTRON_H["layers_block_type"]


def test_mtp_layers_are_accepted_in_the_config_and_skipped_in_the_checkpoint(tmp_path):
    """A checkpoint with multi-token-prediction layers (``mtp.*``, declared by
    ``num_nextn_predict_layers`` and ``mtp_hybrid_override_pattern``) loads as HF loads it: the base
    model's weights, the MTP tensors skipped — with a warning naming them, not silently."""
    from safetensors.torch import load_file, save_file

    model = build_nemotron_h(dict(TINY_NEMOTRON_H), seed=4)
    save_nemotron_h(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E")
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "model.safetensors")
    mtp = {"mtp.layers.0.norm.weight": torch.ones(TINY_NEMOTRON_H["hidden_size"])}
    save_file({**tensors, **mtp}, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match=r"1 multi-token-prediction tensor.*mtp\.layers\.0\.norm\.weight"):
        loaded = load_nemotron_h(tmp_path)
    assert loaded.settings["mtp_layers_block_type"] == ["full_attention", "moe"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_bad_mtp_pattern_is_refused():
    with pytest.raises(ConfigError, match="mtp_hybrid_override_pattern"):
        build_nemotron_h({**TINY_NEMOTRON_H, "mtp_hybrid_override_pattern": "*X"}, seed=0)


def test_a_finite_time_step_upper_bound_is_applied_and_said_to_differ_from_the_peers():
    """HF transformers and vLLM clamp dt below only; a finite upper bound is applied here, as
    mamba_ssm's kernels apply it, so the tokens differ from theirs: a warning says so."""
    with pytest.warns(UserWarning, match=r"time_step_limit.*0\.02.*HF transformers and vLLM ignore"):
        model = build_nemotron_h({**TINY_NEMOTRON_H, "time_step_limit": [0.0, 0.02]}, seed=0)
    mixer = next(b.mixer for b in model.backbone.layers if b.layer_type == "linear_attention")
    assert mixer.dt_max == 0.02


def test_fused_expert_tensors_are_refused_with_the_layout_to_save_instead(tmp_path):
    """Experts stacked into one ``[experts, out, in]`` tensor (HF's in-memory layout) are not read:
    the error says which layout to write, instead of listing every per-expert tensor as missing."""
    from safetensors.torch import load_file, save_file

    save_nemotron_h(build_nemotron_h(dict(TINY_NEMOTRON_H), seed=0), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    layer = next(n.split(".mixer.")[0] for n in tensors if ".mixer.experts.0.up_proj.weight" in n)
    for part in ("up_proj", "down_proj"):
        names = sorted((n for n in tensors if n.startswith(f"{layer}.mixer.experts.") and n.endswith(f".{part}.weight")),
                       key=lambda n: int(n.split(".experts.")[1].split(".")[0]))
        tensors[f"{layer}.mixer.experts.{part}"] = torch.stack([tensors.pop(n) for n in names])
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"fused expert tensors.*experts\.up_proj.*one tensor pair per expert"):
        load_nemotron_h(tmp_path)
