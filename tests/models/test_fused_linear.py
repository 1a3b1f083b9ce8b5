"""FusedProjection: one matmul equals the separate projections, and never serves stale weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tokenstate.models import fused_linear
from tokenstate.models.fused_linear import FusedProjection


def _pair(bias: bool) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(0)
    return nn.Linear(8, 4, bias=bias), nn.Linear(8, 6, bias=bias)


def _reference(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    return torch.cat([lin(x) for lin in linears], dim=-1)  # [n, sum(out)]


def test_fused_matches_separate_and_follows_every_kind_of_weight_change() -> None:
    for bias in (False, True):
        a, b = _pair(bias)
        fused, x = FusedProjection(), torch.randn(3, 8)
        with torch.no_grad():
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
            a.weight.mul_(2)  # in place: the version counter moves
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
            b.weight = nn.Parameter(torch.randn(6, 8))  # replaced
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
            a.load_state_dict({k: torch.randn_like(v) for k, v in a.state_dict().items()})
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
        with torch.inference_mode():
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))


def test_grad_mode_runs_the_separate_projections_so_gradients_reach_them() -> None:
    a, b = _pair(True)
    out = FusedProjection()(torch.randn(3, 8), (a, b))  # [3, 10]
    out.sum().backward()
    assert a.weight.grad is not None and b.weight.grad is not None


def test_inference_tensor_weights_are_not_cached() -> None:
    with torch.inference_mode():
        a, b = nn.Linear(8, 4), nn.Linear(8, 6)
        fused, x = FusedProjection(), torch.randn(3, 8)
        first = fused(x, (a, b))
        a.weight.mul_(3)  # an inference tensor has no version counter to watch
        torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
        assert not torch.equal(first, fused(x, (a, b)))


def test_weights_above_the_size_limit_are_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_linear, "MAX_FUSED_BYTES", 8 * 10 * 4 - 1)  # just under 8x10 float32
    a, b = _pair(False)
    fused, x = FusedProjection(), torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
    assert fused._weight is None  # no duplicate of the weights was kept


def test_cpu_keeps_unpacked_weights_transposed_and_contiguous() -> None:
    for bias in (False, True):
        a, b = _pair(bias)
        fused, x = FusedProjection(), torch.randn(3, 8)
        with torch.no_grad():
            torch.testing.assert_close(fused(x, (a, b)), _reference(x, (a, b)))
            torch.testing.assert_close(fused(x[None], (a, b)), _reference(x, (a, b))[None])  # [1, 3, 10]
        weight_t = fused._weight_t
        assert weight_t is not None and weight_t.shape == (8, 10) and weight_t.is_contiguous()
        assert fused._weight is None  # the transposed copy is the only duplicate
        single = FusedProjection()
        with torch.no_grad():
            torch.testing.assert_close(single(x, (a,)), a(x))
        assert single._weight_t is not None and single._weight_t.data_ptr() != a.weight.data_ptr()


def test_a_single_weight_above_the_size_limit_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_linear, "MAX_FUSED_BYTES", 8 * 4 * 4 - 1)  # just under one 4x8 float32
    a, _ = _pair(False)
    fused, x = FusedProjection(), torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, (a,)), a(x))
    assert fused._weight_t is None and fused._weight is not None
    assert fused._weight.data_ptr() == a.weight.data_ptr()  # no copy: F.linear on the parameter


def test_the_gated_mlp_multiplies_in_place_only_where_nothing_records_gradients() -> None:
    from tokenstate.models.layers import GatedMLP

    torch.manual_seed(0)
    mlp, x = GatedMLP(16, 24, bias=False, act="silu"), torch.randn(5, 16)
    reference = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))  # [5, 16]
    reference.sum().backward()  # grad mode: the product stays out of place, so autograd works
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    mlp(x).sum().backward()
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(mlp.parameters(), grads, strict=True))
    with torch.inference_mode():
        torch.testing.assert_close(mlp(x), reference.detach(), rtol=0, atol=1e-6)  # in place, same values
