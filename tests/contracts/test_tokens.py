from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    ContractViolation,
    DeviceTokens,
    HostTokens,
    StaleHostTokensError,
    TokenStateError,
    checks_mode,
)
from tokenstate.contracts.running import forward_running

from .conftest import i32


def test_stale_read_is_refused_naming_rows_slots_positions_and_fix(step):
    host = step.host()
    with pytest.raises(StaleHostTokensError) as info:
        _ = host.ids
    err = info.value
    assert err.rows == (1,) and err.slots == (0,) and err.positions == (3,)
    message = str(err)
    assert "rows [1] (slots [0]), positions [3]" in message
    assert "inp.device_tokens.ids" in message and "honors_device_token_ids" in message
    # Only a factory that declared the opt-in gets such a step: the fix names the broken promise.
    assert "declares honors_device_token_ids=True, and this forward breaks that promise" in message
    assert isinstance(err, ContractViolation) and isinstance(err, TypeError)
    assert isinstance(err, TokenStateError)


def test_fresh_rows_stay_readable_when_others_are_stale(step):
    host = step.host()
    assert host.row_ids(0).tolist() == [1, 2, 3]
    assert host.row_ids(2).tolist() == [4, 5]
    with pytest.raises(StaleHostTokensError, match=r"row_ids\(1\): .*rows \[1\]"):
        host.row_ids(1)
    with pytest.raises(ContractViolation, match=r"row 3 is outside \[0, 3\)"):
        host.row_ids(3)


def test_fresh_only_host_tokens_are_readable():
    host = HostTokens.fresh(i32([5, 6, 7]), i32([0, 2, 3]), i32([0, 1]))
    assert not host.has_stale and host.stale_rows == ()
    assert host.ids.tolist() == [5, 6, 7]


def test_host_tokens_reports_stale_rows_and_keeps_placeholder_buffer(step):
    host = step.host()
    assert host.has_stale and host.stale_rows == (1,)
    assert host.placeholder_buffer().tolist() == [1, 2, 3, PLACEHOLDER, 4, 5]
    assert "stale_rows=[1]" in repr(host)


def test_the_raw_buffer_is_refused_only_to_a_running_forward_on_a_stale_step(step):
    host = step.host()
    # Outside every forward (a combine kernel's input, the runner's own staging) it is readable.
    assert host.placeholder_buffer().tolist() == [1, 2, 3, PLACEHOLDER, 4, 5]
    with forward_running("my_model.forward"), pytest.raises(
        StaleHostTokensError, match=r"placeholder_buffer\(\) in forward my_model\.forward: .*rows \[1\] \(slots \[0\]\)"
    ):
        host.placeholder_buffer()
    fresh = HostTokens.fresh(i32([1, 2, 3]), i32([0, 3]), i32([0]))
    with forward_running("my_model.forward"):
        assert fresh.placeholder_buffer().tolist() == [1, 2, 3]  # no stale position: nothing to refuse


def test_long_stale_lists_are_abbreviated():
    n = 12
    stale = torch.ones(n, dtype=torch.bool)
    host = HostTokens(torch.full((n,), PLACEHOLDER, dtype=torch.int32), stale, i32(list(range(n + 1))), i32(list(range(n))))
    with pytest.raises(StaleHostTokensError, match=r"positions \[0, 1, 2, 3, 4, 5, 6, 7\] \(\+4 more\)"):
        _ = host.ids


@pytest.mark.parametrize(
    ("ids", "stale", "qsl", "slots", "message"),
    [
        ([1.0, 2.0], [False, False], [0, 2], [0], "ids must be int32 or int64, got torch.float32"),
        ([[1, 2]], [False, False], [0, 2], [0], r"ids must be \[num_tokens\], got shape \(1, 2\)"),
        ([1, 2], [False], [0, 2], [0], "stale must be a bool tensor of shape"),
        ([1, 2], [False, False], [0, 2], [0, 1], r"query_start_loc must be \[num_rows \+ 1\]"),
        ([1, 2], [False, False], [0, 3], [0], "must rise from 0 to num_tokens=2"),
    ],
)
def test_host_tokens_refuses_malformed_input(ids, stale, qsl, slots, message):
    ids_t = torch.tensor(ids) if isinstance(ids[0], float) else torch.tensor(ids, dtype=torch.int32)
    with pytest.raises(ContractViolation, match=message):
        HostTokens(ids_t, torch.tensor(stale), i32(qsl), i32(slots))


@pytest.mark.parametrize("mode", ["off", "boundary", "full"])
def test_every_mode_refuses_a_placeholder_outside_the_stale_mask(mode):
    with checks_mode(mode), pytest.raises(ContractViolation, match=r"positions \[1\] are not marked stale but hold negative ids"):
        HostTokens(i32([1, PLACEHOLDER]), torch.zeros(2, dtype=torch.bool), i32([0, 2]), i32([0]))
    with checks_mode(mode), pytest.raises(ContractViolation, match=r"stale_position_mask\(\) computes it; HostTokens\.fresh\(\.\.\.\) marks none"):
        HostTokens.fresh(i32([PLACEHOLDER, 4]), i32([0, 2]), i32([0]))
    HostTokens(i32([1, PLACEHOLDER]), torch.tensor([False, True]), i32([0, 2]), i32([0]))  # stale: fine


def test_device_tokens_cannot_be_constructed_directly():
    with pytest.raises(ContractViolation, match=r"cannot be constructed directly: use DeviceTokens\.from_combine"):
        DeviceTokens(i32([1]), 5)


def test_device_tokens_cannot_be_uploaded_from_stale_host_ids(step):
    with pytest.raises(StaleHostTokensError, match=r"rows \[1\]"):
        DeviceTokens.from_host(step.host(), "cpu", vocab_size=step.vocab)


def test_device_tokens_from_fresh_host_upload():
    host = HostTokens.fresh(i32([5, 6]), i32([0, 2]), i32([3]))
    dev = DeviceTokens.from_host(host, "cpu", vocab_size=10)
    assert dev.ids.tolist() == [5, 6] and dev.vocab_size == 10 and dev.num_tokens == 2
    assert "DeviceTokens(num_tokens=2, device=cpu" in repr(dev)


def test_device_tokens_validates_metadata():
    with pytest.raises(ContractViolation, match="vocab_size must be a positive int"):
        DeviceTokens.from_combine(i32([1]), vocab_size=0)
    with pytest.raises(ContractViolation, match="must be contiguous"):
        DeviceTokens.from_combine(i32([1, 2, 3, 4])[::2], vocab_size=5)


@pytest.mark.parametrize("mode", ["off", "boundary", "full"])
@pytest.mark.parametrize("ids", [[PLACEHOLDER], [2, 5], [0, 4, -3]])
def test_device_tokens_on_the_cpu_refuse_ids_outside_the_vocabulary_in_every_mode(mode, ids):
    with checks_mode(mode), pytest.raises(ContractViolation, match=r"ids must lie in \[0, 5\), got min .*positions"):
        DeviceTokens.from_combine(i32(ids), vocab_size=5)
    assert DeviceTokens.from_combine(i32([0, 4]), vocab_size=5).ids.tolist() == [0, 4]


def test_a_fresh_rows_ids_do_not_expose_the_rest_of_the_buffer():
    """``row_ids(r)`` of a fresh row on a stale step is legal; its storage must not reach the other
    rows' placeholders (``as_strided`` or ``untyped_storage`` on a view would)."""
    from tokenstate.tools.demo import demo_step

    inp, _ = demo_step()  # row 0 a fresh prefill chunk, row 1 a stale decode row
    row = inp.host_tokens.row_ids(0)
    assert row.untyped_storage().nbytes() == row.numel() * row.element_size()
    assert PLACEHOLDER not in row.as_strided((row.numel(),), (1,), 0).tolist()
