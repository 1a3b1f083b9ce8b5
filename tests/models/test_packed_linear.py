"""oneDNN pre-packed projections: same results as ``F.linear``, never stale, HF parity and the token
gate kept, and the model still copies, moves and round-trips its weights.

The reference presets are too small to be packed by default (see ``MIN_PACKED_ELEMENTS``), and above
that size the path is measured (``tokenstate.models.cpu_gemm``), so most tests here force packing for
every projection.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tokenstate.models import cpu_gemm, fused_linear
from tokenstate.models.fused_linear import FusedProjection, onednn_packing_available, prepack
from tokenstate.models.llama import FACTORY, build, load, save

pytestmark = pytest.mark.skipif(
    not onednn_packing_available(), reason="this torch build has no oneDNN pre-packed linear ops"
)

CONFIG = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "tie_word_embeddings": True, "attention_bias": True, "eos_token_id": 2,
}  # fmt: skip


@pytest.fixture
def force_packing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused_linear, "MIN_PACKED_ELEMENTS", 1)
    with cpu_gemm.cpu_gemm_mode("onednn"):
        yield


def _projections(model: nn.Module) -> list[FusedProjection]:
    return [v for m in model.modules() for v in vars(m).values() if isinstance(v, FusedProjection)]


def _reference(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    return torch.cat([lin(x) for lin in linears], dim=-1)  # [n, sum(out)]


@pytest.mark.usefixtures("force_packing")
@pytest.mark.parametrize("group", [1, 3])
def test_packed_projection_matches_f_linear_and_follows_weight_changes(group: int) -> None:
    torch.manual_seed(0)
    for bias in (False, True):
        linears = tuple(nn.Linear(32, 8 * (i + 1), bias=bias) for i in range(group))
        fused = FusedProjection()
        for rows in (1, 5, 16, 40):
            x = torch.randn(rows, 32)
            with torch.no_grad():
                torch.testing.assert_close(fused(x, linears), _reference(x, linears), atol=1e-5, rtol=1e-5)
                assert fused.packed
                linears[0].weight.mul_(2)  # in place: the version counter moves
                torch.testing.assert_close(fused(x, linears), _reference(x, linears), atol=1e-5, rtol=1e-5)
                linears[-1].weight = nn.Parameter(torch.randn_like(linears[-1].weight))  # replaced
                torch.testing.assert_close(fused(x, linears), _reference(x, linears), atol=1e-5, rtol=1e-5)
            with torch.inference_mode():
                torch.testing.assert_close(fused(x, linears), _reference(x, linears), atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("force_packing")
def test_small_packed_groups_serve_one_row_inputs_from_the_transposed_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    linears = (nn.Linear(32, 8, bias=False), nn.Linear(32, 16, bias=False))
    weight_t = torch.cat([lin.weight for lin in linears]).t().contiguous()  # [32, 24]
    one_row, rows = torch.randn(1, 32), torch.randn(6, 32)
    fused = FusedProjection()
    with torch.no_grad():
        assert torch.equal(fused(one_row, linears), torch.mm(one_row, weight_t))  # MKL, not oneDNN
        assert fused.packed and fused._weight_t is not None and fused._weight is None
        torch.testing.assert_close(fused(rows, linears), _reference(rows, linears), atol=1e-5, rtol=1e-5)
        linears[1].weight.add_(1.0)  # both copies follow a weight change
        weight_t = torch.cat([lin.weight for lin in linears]).t().contiguous()
        assert torch.equal(fused(one_row, linears), torch.mm(one_row, weight_t))
        torch.testing.assert_close(fused(rows, linears), _reference(rows, linears), atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(fused_linear, "MIN_ONE_ROW_PACKED_ELEMENTS", 1)  # big groups: packed copy only
    big = FusedProjection()
    with torch.no_grad():
        torch.testing.assert_close(big(one_row, linears), _reference(one_row, linears), atol=1e-5, rtol=1e-5)
    assert big.packed and big._weight_t is None and big._weight is None


def test_small_weights_stay_unpacked_and_pinned_bigger_ones_are_packed_at_build() -> None:
    small = FACTORY.build_preset("tiny-llama")
    assert not any(p.packed for p in _projections(small))
    hidden_256 = {**CONFIG, "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 1,
                  "tie_word_embeddings": False}  # fmt: skip
    with cpu_gemm.cpu_gemm_mode("onednn"):
        layer = build(hidden_256).model.layers[0]
    # q/k/v (2^17 elements), gate/up and down are packed; o_proj (2^16) stays on torch.mm.
    assert [layer.self_attn._qkv.packed, layer.self_attn._o.packed] == [True, False]
    assert layer.mlp._gate_up.packed and layer.mlp._down.packed
    with cpu_gemm.cpu_gemm_mode("mm"):
        layer = build(hidden_256).model.layers[0]
    projections = [layer.self_attn._qkv, layer.self_attn._o, layer.mlp._gate_up, layer.mlp._down]
    assert not any(p.packed for p in projections) and all(p._weight_t is not None for p in projections)
    big = {**CONFIG, "vocab_size": 1024, "hidden_size": 1024, "intermediate_size": 1024, "num_attention_heads": 16,
           "num_key_value_heads": 16, "num_hidden_layers": 1}  # fmt: skip
    with cpu_gemm.cpu_gemm_mode("onednn"):
        model = build(big)
    projections = _projections(model)
    assert len(projections) == 5 and all(p.packed for p in projections)  # qkv, o, gate_up, down, head
    assert all(p._seen for p in projections)  # built at build time, not on the first step


@pytest.mark.usefixtures("force_packing")
def test_packed_llama_matches_hf_logits(tmp_path, hf_oracle, make_input) -> None:
    ours = build(CONFIG, seed=3)
    assert all(p.packed for p in _projections(ours))
    save(ours, tmp_path)
    hf = hf_oracle.load(tmp_path)
    ours.allocate_slots(4)
    a, b = torch.randint(3, 256, (30,)).tolist(), torch.randint(3, 256, (12,)).tolist()
    steps = [
        [(0, a[:20]), (2, b[:4])],
        [(0, a[20:21], 20), (2, b[4:7], 4, 2)],
        [(0, a[21:22], 21), (2, b[7:8], 7)],
    ]
    diff = hf_oracle.max_step_diff(FACTORY.forward, ours, hf, steps, make_input, vocab_size=256)
    assert diff <= 1e-4


@pytest.mark.usefixtures("force_packing")
def test_packed_llama_passes_the_greedy_gate(tmp_path, hf_oracle) -> None:
    runtime = pytest.importorskip("tokenstate.runtime")
    model = FACTORY.build_preset("tiny-llama")
    save(model, tmp_path)
    hf = hf_oracle.load(tmp_path)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (1, 9, 33, 70, 4, 21)]
    expected = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=24, pad_token_id=0)  # fmt: skip
            expected.append(out[0, len(p) :].tolist())
    for async_scheduling in (False, True):
        llm = runtime.LLM(FACTORY, async_scheduling=async_scheduling, max_num_seqs=4, max_num_batched_tokens=64)
        assert all(p.packed for p in _projections(llm.model))
        got = [list(o.token_ids) for o in llm.generate(prompts, runtime.SamplingParams(max_tokens=24))]
        assert got == expected, f"async={async_scheduling}"


@pytest.mark.usefixtures("force_packing")
def test_packed_model_copies_moves_and_round_trips(tmp_path, make_input) -> None:
    model = build(CONFIG, seed=4)
    model.allocate_slots(2)
    inp = make_input([(0, [5, 6, 7, 8]), (1, [9, 10])], vocab_size=256)
    reference = FACTORY.forward(model, inp)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert not any(p._seen for p in _projections(other))  # a copy starts with an empty cache
        other.allocate_slots(2)
        torch.testing.assert_close(FACTORY.forward(other, inp), reference)
    save(model, tmp_path)
    loaded = load(tmp_path)
    assert all(p.packed for p in _projections(loaded))
    loaded.allocate_slots(2)
    torch.testing.assert_close(FACTORY.forward(loaded, inp), reference)
    assert set(loaded.state_dict()) == set(model.state_dict())  # no packed copy in the state dict
    doubled = prepack(copy.deepcopy(model).double())  # float64: not packable, runs F.linear
    doubled.allocate_slots(2)
    assert not any(p.packed for p in _projections(doubled))
    torch.testing.assert_close(FACTORY.forward(doubled, inp), reference, atol=1e-4, rtol=1e-4)
