"""Kimi-Linear vs HF ``KimiLinearForCausalLM`` (fp32 logits), driven through real ForwardInputs.

Covers multi-row prefill (rows of equal length share one batched recurrence), step-by-step decode
with device token ids, mixed prefill + decode steps, chunked prefill continuing the KDA conv and
recurrent state, slot isolation and slot reuse. HF runs its pure-torch KDA fallbacks on the CPU
(``chunk_kda`` / ``fused_recurrent_kda`` and ``causal_conv1d_*`` without ``fla``/``causal_conv1d``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tokenstate.contracts import ConfigError, ContractViolation
from tokenstate.models.kimi_linear import (
    KIMI_LINEAR,
    TINY_KIMI_LINEAR,
    KimiLinear,
    build,
    forward,
    save,
)

pytest.importorskip("transformers")

TOL = 1e-4

CONFIGS = {
    # MoE on 3 of 4 layers, KDA/MLA alternating, query without a latent (the preset).
    "moe-alternating": dict(TINY_KIMI_LINEAR),
    # Dense MLPs only, MLA first, query latent, attention biases, odd conv kernel.
    "dense-qlora-bias": {
        "vocab_size": 300, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
        "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        "mlp_layer_types": ["dense", "dense", "dense"], "num_attention_heads": 3,
        "kv_lora_rank": 20, "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
        "v_head_dim": 12, "attention_bias": True,
        "linear_num_heads": 2, "linear_head_dim": 24, "linear_conv_kernel_dim": 3,
        "max_position_embeddings": 512,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    },
    # KDA only (no MLA cache at all), every MLP sparse, no renormalisation, two shared experts.
    "kda-only-moe": {
        "vocab_size": 256, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "linear_attention"], "mlp_layer_types": ["sparse", "sparse"],
        "num_local_experts": 6, "num_experts_per_tok": 3, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": False, "n_shared_experts": 2, "routed_scaling_factor": 1.5,
        "linear_num_heads": 2, "linear_head_dim": 16, "max_position_embeddings": 512,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    },
    # HF applies hidden_act to the KDA short conv as well as the MLPs; no shared expert at all.
    "gelu-no-shared": {
        "vocab_size": 256, "hidden_size": 32, "moe_intermediate_size": 16, "intermediate_size": 48,
        "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
        "mlp_layer_types": ["sparse", "dense"], "hidden_act": "gelu",
        "num_local_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
        "n_shared_experts": 0, "num_attention_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8, "v_head_dim": 8,
        "linear_num_heads": 2, "linear_head_dim": 16, "max_position_embeddings": 512,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    },
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny ops: a second intra-op thread only adds contention on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory, hf_oracle):
    """(config dict, our model, the HF oracle loaded from our saved weights)."""
    config = CONFIGS[request.param]
    ours = build(dict(config), device="cpu", seed=7)
    # HF initialises the routers' selection bias to zero; a real checkpoint's is not, so make it count.
    g = torch.Generator().manual_seed(8)
    for name, buffer in ours.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn(buffer.shape, generator=g) * 0.2)
    path = tmp_path_factory.mktemp(request.param)
    save(ours, path)
    with warnings.catch_warnings():  # HF's zero-width shared expert (n_shared_experts=0) says so
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
        return config, ours, hf_oracle.load(path)


def fresh(ours: KimiLinear, num_slots: int = 4) -> KimiLinear:
    ours.allocate_slots(num_slots)
    return ours


def prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def test_prefill_rows_match_hf(pair, make_input, hf_oracle):
    config, ours, hf = pair
    fresh(ours)
    # Two rows of equal length (one batched recurrence), a single-token row, a short row.
    seqs = prompts(config["vocab_size"], [23, 23, 1, 9])
    inp = make_input(
        [(2, seqs[0]), (0, seqs[1]), (3, seqs[2]), (1, seqs[3])], vocab_size=config["vocab_size"], all_logits=True
    )
    got = forward(ours, inp)  # [num_tokens, vocab]
    start = 0
    for seq in seqs:
        want = hf_oracle.logits(hf, seq)
        torch.testing.assert_close(got[start : start + len(seq)], want, atol=TOL, rtol=0)
        start += len(seq)


def test_step_by_step_decode_matches_hf(pair, make_input, hf_oracle):
    """Prefill, then decode steps of single-token rows read from device ids, a late request joining."""
    config, ours, hf = pair
    fresh(ours)
    vocab = config["vocab_size"]
    seqs = prompts(vocab, [12, 5, 30, 8], seed=1)  # each: prompt + teacher-forced continuation
    prompt_lens = [7, 2, 20, 8]
    slots = [3, 0, 2, 1]
    want = [hf_oracle.logits(hf, s) for s in seqs]
    done = [0, 0, 0, 0]
    # Step 0: requests 0 and 1 prefill; request 2 and 3 arrive later.
    active = [0, 1]
    rows = [(slots[i], seqs[i][: prompt_lens[i]]) for i in active]
    for step in range(8):
        decode_only = all(len(tokens) == 1 for _, tokens, *_ in rows)
        # As on the async path: after the first step the ids come from the device, and a pure
        # decode step's host buffer holds placeholders at every row's last position.
        inp = make_input(rows, vocab_size=vocab, stale_last=step > 0 and decode_only, device_ids=step > 0)
        got = forward(ours, inp)  # [num_rows, vocab]: each row's last position
        for row, i in enumerate(active):
            done[i] += len(rows[row][1])
            torch.testing.assert_close(got[row], want[i][done[i] - 1], atol=TOL, rtol=0)
        if step == 1:
            active += [2, 3]  # a prefill row (20 tokens) joins single-token decode rows
        active = [i for i in active if done[i] < len(seqs[i])]
        rows = [
            (slots[i], seqs[i][done[i] : done[i] + (prompt_lens[i] if done[i] == 0 else 1)], done[i])
            for i in active
        ]
    assert done[1] == len(seqs[1]) and done[2] > prompt_lens[2]


@pytest.mark.parametrize("split", [2, 11])
def test_chunked_prefill_equals_one_step(pair, make_input, hf_oracle, split):
    """A prompt split across two steps continues KDA conv/recurrent state and the MLA cache."""
    config, ours, hf = pair
    vocab = config["vocab_size"]
    (seq,) = prompts(vocab, [20], seed=2)
    fresh(ours)
    one = forward(ours, make_input([(1, seq)], vocab_size=vocab, all_logits=True))
    fresh(ours)
    first = forward(ours, make_input([(1, seq[:split])], vocab_size=vocab, all_logits=True))
    second = forward(ours, make_input([(1, seq[split:], split)], vocab_size=vocab, all_logits=True))
    torch.testing.assert_close(torch.cat([first, second]), one, atol=1e-5, rtol=0)
    torch.testing.assert_close(second, hf_oracle.logits(hf, seq)[split:], atol=TOL, rtol=0)


def test_slots_are_isolated_and_reset_on_reuse(make_input):
    model = build(dict(TINY_KIMI_LINEAR), seed=3)
    vocab = model.vocab_size
    x, y = prompts(vocab, [10, 16], seed=4)
    fresh(model)
    alone = [forward(model, make_input([(0, x[:6])], vocab_size=vocab))]
    alone += [forward(model, make_input([(0, [t], 6 + k)], vocab_size=vocab)) for k, t in enumerate(x[6:])]

    fresh(model)
    forward(model, make_input([(1, y[:9])], vocab_size=vocab))  # another request's state in slot 1
    shared = [forward(model, make_input([(1, y[9:11], 9), (0, x[:6])], vocab_size=vocab))[1:]]
    for k, t in enumerate(x[6:]):
        shared.append(forward(model, make_input([(0, [t], 6 + k), (1, [y[11 + k]], 11 + k)], vocab_size=vocab))[:1])
    torch.testing.assert_close(torch.cat(shared), torch.cat(alone), atol=1e-5, rtol=0)

    # Slot 0 reused for a new request: reset_slot re-seeds it, so it matches a fresh model ...
    model.reset_slot(0)
    reused = forward(model, make_input([(0, y[:5])], vocab_size=vocab, all_logits=True))
    fresh(model)
    clean = forward(model, make_input([(0, y[:5])], vocab_size=vocab, all_logits=True))
    torch.testing.assert_close(reused, clean, atol=1e-5, rtol=0)
    # ... and without the reset the old request's recurrent state would leak into it.
    forward(model, make_input([(1, x[:6])], vocab_size=vocab))
    leaked = forward(model, make_input([(1, y[:5])], vocab_size=vocab, all_logits=True))
    assert (leaked - clean).abs().max() > 1e-2


def test_forward_embeds_device_ids_not_host_placeholders(make_input):
    model = fresh(build(dict(TINY_KIMI_LINEAR), seed=5))
    vocab = model.vocab_size
    seq_a, seq_b = prompts(vocab, [6, 4], seed=6)
    forward(model, make_input([(0, seq_a[:5]), (1, seq_b[:3])], vocab_size=vocab))
    stale = make_input([(0, seq_a[5:], 5), (1, seq_b[3:], 3)], vocab_size=vocab, stale_last=True)
    assert stale.host_tokens.has_stale  # the host holds PLACEHOLDER at both rows
    via_device = forward(model, stale)
    fresh(model)
    forward(model, make_input([(0, seq_a[:5]), (1, seq_b[:3])], vocab_size=vocab))
    via_host = forward(model, make_input([(0, seq_a[5:], 5), (1, seq_b[3:], 3)], vocab_size=vocab))
    torch.testing.assert_close(via_device, via_host, atol=0, rtol=0)


def test_forward_before_allocate_slots_or_beyond_them_is_refused(make_input):
    model = build(dict(TINY_KIMI_LINEAR), seed=0)
    with pytest.raises(ConfigError, match="allocate_slots"):
        forward(model, make_input([(0, [5, 6])], vocab_size=model.vocab_size))
    model.allocate_slots(2)
    with pytest.raises(ContractViolation, match=r"slots \[2\], outside the 2 allocated slots"):
        forward(model, make_input([(1, [5]), (2, [6])], vocab_size=model.vocab_size))


def test_factory_and_preset():
    assert KIMI_LINEAR.honors_device_token_ids is True
    assert KIMI_LINEAR.supports_speculative is True  # recurrent state rolls back by checkpoint
    a = KIMI_LINEAR.build_preset("tiny-kimi-linear")
    b = KIMI_LINEAR.build_preset("tiny-kimi-linear")
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(ta, tb), name
    kinds = [type(layer.self_attn).__name__ for layer in a.model.layers]
    assert {"KimiDeltaAttention", "MultiHeadLatentAttention"} <= set(kinds)
    assert any(type(layer.block_sparse_moe).__name__ == "SharedExpertMoE" for layer in a.model.layers)
    assert a.max_model_len >= 512 and a.eos_token_id == 2


def test_preset_greedy_does_not_degenerate(make_input):
    """Scaled-up init: greedy decoding of the preset neither repeats one token nor echoes the prompt."""
    model = fresh(KIMI_LINEAR.build_preset("tiny-kimi-linear"))
    vocab = model.vocab_size
    (prompt,) = prompts(vocab, [8], seed=8)
    tokens = []
    logits = forward(model, make_input([(0, prompt)], vocab_size=vocab))
    for k in range(32):
        tokens.append(int(logits[0].argmax()))
        logits = forward(model, make_input([(0, tokens[-1:], len(prompt) + k)], vocab_size=vocab))
    assert len(set(tokens)) >= 16, tokens
    assert sum(t == prompt[-1] for t in tokens) <= 2, tokens
