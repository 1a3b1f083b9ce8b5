"""The CPU GEMM choice: measured once per weight shape (``auto``), or pinned (``onednn``, ``mm``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tokenstate.contracts import ConfigError
from tokenstate.models import cpu_gemm
from tokenstate.models.cpu_gemm import (
    GemmChoice,
    cpu_gemm_mode,
    gemm_choices,
    get_cpu_gemm_mode,
    set_cpu_gemm_mode,
)
from tokenstate.models.fused_linear import FusedProjection, onednn_packing_available

pytestmark = pytest.mark.skipif(not onednn_packing_available(), reason="no oneDNN pre-packed linear ops in this torch")


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """A stubbed measurement (oneDNN wins for weights with more outputs than inputs) that logs shapes."""
    calls: list[tuple[int, int]] = []

    def measure(weight: torch.Tensor, *, one_row_eligible: bool) -> GemmChoice:
        calls.append(tuple(weight.shape))
        out_features, in_features = weight.shape
        wins = out_features > in_features
        return GemmChoice(packed=wins, one_row_mm=wins and one_row_eligible, onednn_us=1.0, mm_us=2.0)

    monkeypatch.setattr(cpu_gemm, "_measure", measure)
    monkeypatch.setattr(cpu_gemm, "_choices", {})
    with cpu_gemm_mode("auto"):
        yield calls


def test_auto_runs_the_measured_path_and_measures_each_shape_once(measured: list[tuple[int, int]]) -> None:
    torch.manual_seed(0)
    wide, square = (nn.Linear(512, 512, bias=False), nn.Linear(512, 256, bias=False)), (nn.Linear(512, 512),)
    x = torch.randn(16, 512)
    with torch.no_grad():
        fused_wide, fused_square, again = FusedProjection(), FusedProjection(), FusedProjection()
        for fused, linears in ((fused_wide, wide), (fused_square, square), (again, wide)):
            expected = torch.cat([lin(x) for lin in linears], dim=-1)
            torch.testing.assert_close(fused(x, linears), expected, atol=1e-4, rtol=1e-4)
    assert fused_wide.packed and again.packed  # [768, 512]: more outputs than inputs, oneDNN measured faster
    assert not fused_square.packed and fused_square._weight_t is not None  # torch.mm on the transposed copy
    assert measured == [(768, 512), (512, 512)]  # the second [768, 512] group reused the first measurement
    threads = torch.get_num_threads()
    assert set(gemm_choices()) == {(512, 768, threads, True), (512, 512, threads, True)}


def test_a_weight_change_rebuilds_along_the_measured_path(measured: list[tuple[int, int]]) -> None:
    linear = nn.Linear(256, 1024, bias=False)
    fused, x = FusedProjection(), torch.randn(4, 256)
    with torch.no_grad():
        fused(x, (linear,))
        linear.weight.mul_(3)
        torch.testing.assert_close(fused(x, (linear,)), linear(x), atol=1e-4, rtol=1e-4)
    assert fused.packed and measured == [(1024, 256)]


@pytest.mark.parametrize(("mode", "packed"), [("onednn", True), ("mm", False)])
def test_a_pinned_mode_measures_nothing(measured: list[tuple[int, int]], mode: str, packed: bool) -> None:
    linear = nn.Linear(512, 1024)
    with torch.no_grad(), cpu_gemm_mode(mode):
        fused = FusedProjection()
        torch.testing.assert_close(fused(torch.randn(3, 512), (linear,)).shape, torch.Size([3, 1024]))
    assert fused.packed is packed and measured == []
    assert get_cpu_gemm_mode() == "auto"  # restored after the block


def test_the_real_measurement_times_both_paths() -> None:
    choice = cpu_gemm._measure(torch.randn(384, 256), one_row_eligible=True)
    assert choice.onednn_us is not None and choice.onednn_us > 0 and choice.mm_us is not None and choice.mm_us > 0
    assert choice.packed == (choice.onednn_us < choice.mm_us)
    if choice.packed:  # the one-row copy is kept exactly where torch.mm measured faster at one row
        assert choice.mm_one_row_us is not None and choice.onednn_one_row_us is not None
        assert choice.one_row_mm == (choice.mm_one_row_us < choice.onednn_one_row_us)
    else:
        assert not choice.one_row_mm and choice.mm_one_row_us is None


def test_a_measurement_under_inference_mode_leaves_later_ones_outside_it_working(monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine re-packs a weight changed in place lazily, inside its step's inference mode; a
    # model built afterwards (outside it) measures again with the same eviction buffer.
    monkeypatch.setattr(cpu_gemm._state, "evict_buffer", None)
    with torch.inference_mode():
        cpu_gemm._measure(torch.randn(384, 256), one_row_eligible=False)
    assert cpu_gemm._measure(torch.randn(384, 256), one_row_eligible=False).mm_us > 0


def test_a_bad_mode_is_refused_with_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"not a CPU GEMM mode; valid values: auto, onednn, mm"):
        set_cpu_gemm_mode("fastest")
    monkeypatch.setattr(cpu_gemm._state, "mode", None)
    monkeypatch.setenv(cpu_gemm.CPU_GEMM_ENV, "MKL")
    with pytest.raises(ConfigError, match=r"TOKENSTATE_CPU_GEMM='MKL' is not a CPU GEMM mode"):
        get_cpu_gemm_mode()
    monkeypatch.setenv(cpu_gemm.CPU_GEMM_ENV, " OneDNN ")
    assert get_cpu_gemm_mode() == "onednn"


def _tiny_llama_config(layers: int = 2) -> dict:
    return {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 64}  # fmt: skip


def test_prepack_decides_every_shape_by_passes_over_the_models_gemms_in_step_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stubbed pass timer: packing the q/k/v and LM-head shapes makes a pass faster, packing the
    MLP's slower. The search keeps exactly the faster flips and times no shape alone."""
    from tokenstate.models.llama import build

    saved_us = {(256, 512): 3.0, (256, 1536): -2.0, (768, 256): -1.0, (256, 1024): 1.0}  # per packed call
    passes: list[list[tuple[int, int]]] = []  # the GEMMs of every timed pass, in order

    def pass_us(timed: list, layouts: dict[str, list[bool]]) -> dict[str, float]:
        gemms = [(k[0], k[1]) for k, _, _ in timed]
        passes.append(gemms)
        return {name: 100.0 - sum(saved_us[g] for g, packs in zip(gemms, layout, strict=True) if packs)
                for name, layout in layouts.items()}  # fmt: skip

    monkeypatch.setattr(cpu_gemm, "_choices", {})
    monkeypatch.setattr(cpu_gemm, "_pass_us", pass_us)
    monkeypatch.setattr(cpu_gemm, "_measure", lambda *a, **k: pytest.fail("a shape was timed alone"))
    monkeypatch.setattr(cpu_gemm, "_with_one_row", lambda choice, packed, weight_t: choice)
    with cpu_gemm_mode("auto"):
        model = build(_tiny_llama_config())
    decided = {(k[0], k[1]): c for k, c in gemm_choices().items()}
    assert {shape: c.packed for shape, c in decided.items()} == {
        (256, 512): True, (256, 1536): False, (768, 256): False, (256, 1024): True,
    }  # fmt: skip
    assert all(c.model_pass and c.onednn_us is not None and c.mm_us is not None for c in decided.values())
    # Two configurations to start from, then one comparison per shape; every pass runs the model's
    # GEMMs in step order: per layer q/k/v, gate/up, down (o_proj is below the floor), the LM head last.
    layer = [(256, 512), (256, 1536), (768, 256)]
    assert passes == [layer * 2 + [(256, 1024)]] * 5
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[1].mlp
    assert attention._qkv.packed and not mlp._gate_up.packed and not mlp._down.packed and model._head.packed


def test_the_real_model_pass_decides_each_new_shape_once_and_runs_its_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenstate.models.llama import build

    monkeypatch.setattr(cpu_gemm, "_choices", {})
    with cpu_gemm_mode("auto"):
        model = build(_tiny_llama_config(layers=1))
        decided = gemm_choices()
        again = build(_tiny_llama_config(layers=1))  # same shapes: nothing is timed again
    assert gemm_choices() == decided
    shapes = {(k[0], k[1]) for k in decided}
    assert shapes == {(256, 512), (256, 1536), (768, 256), (256, 1024)}  # o_proj (2^16) is below the floor
    for choice in decided.values():
        assert choice.model_pass and choice.onednn_us > 0 and choice.mm_us > 0
        assert choice.packed == (choice.onednn_us < choice.mm_us)
        assert choice.one_row_mm == (choice.packed and choice.mm_one_row_us < choice.onednn_one_row_us)
    qkv_choice = next(c for k, c in decided.items() if (k[0], k[1]) == (256, 512))
    for m in (model, again):
        assert m.model.layers[0].self_attn._qkv.packed is qkv_choice.packed


def test_a_pinned_mode_runs_no_model_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenstate.models.llama import build

    monkeypatch.setattr(cpu_gemm, "_choices", {})
    monkeypatch.setattr(cpu_gemm, "_median_us", lambda *a, **k: pytest.fail("timed under a pinned mode"))
    with cpu_gemm_mode("mm"):
        model = build(_tiny_llama_config(layers=1))
    assert gemm_choices() == {} and not model.model.layers[0].self_attn._qkv.packed


def test_a_shape_no_pass_decided_is_timed_alone_with_the_models_weights_streaming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A projection outside any model pass (a lone FusedProjection in a model's prepack) falls back
    to timing its shape alone, with the model's own weights read between the timed calls."""
    swept: list[int] = []

    def measure(weight: torch.Tensor, *, one_row_eligible: bool) -> GemmChoice:
        swept.append(sum(t.numel() for t in cpu_gemm._state.sweep))
        return GemmChoice(packed=False, one_row_mm=False)

    class Lone(nn.Module):  # lists no projections(): its prepack hook alone builds the cache
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.fused = nn.Linear(512, 768, bias=False), FusedProjection()

        def prepack_linears(self) -> None:
            self.fused.prepare((self.proj,))

    monkeypatch.setattr(cpu_gemm, "_measure", measure)
    monkeypatch.setattr(cpu_gemm, "_choices", {})
    from tokenstate.models.fused_linear import prepack

    with cpu_gemm_mode("auto"):
        model = prepack(Lone())
    assert swept == [768 * 512] and cpu_gemm._state.sweep == ()  # the sweep is dropped afterwards
    assert not model.fused.packed
