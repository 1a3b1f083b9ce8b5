"""The public toy model: batch invariance, the slot contract, save/load and its three forwards."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import (
    BatchLayout,
    ConfigError,
    ContractViolation,
    ForwardInput,
    HostTokens,
)
from tokenstate.models.toy import (
    ToyLM,
    toy_factory,
    toy_forward,
    toy_forward_host_ids,
    toy_forward_placeholder_buffer,
)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def step_input(rows: list[tuple[int, int, list[int]]]) -> ForwardInput:
    """Fresh host input for rows of (slot, num_computed, token ids); one logit per row."""
    lens = [len(ids) for _, _, ids in rows]
    qsl = i32([0, *torch.tensor(lens).cumsum(0).tolist()])
    ids = i32([t for _, _, r in rows for t in r])
    slots = i32([s for s, _, _ in rows])
    seq = i32([c + n for (_, c, _), n in zip(rows, lens, strict=True)])
    logits = (qsl[1:] - 1).long()
    positions = torch.tensor([c + j for (_, c, r) in rows for j in range(len(r))])
    layout = BatchLayout(qsl, seq, slots, torch.zeros_like(slots), logits)
    host = HostTokens.fresh(ids, qsl, slots)
    return ForwardInput(host, None, positions, layout, logits, slots.long())


def fresh_model(num_slots: int = 4) -> ToyLM:
    model = toy_factory().build_preset("toylm")
    model.allocate_slots(num_slots)
    return model


def test_logits_are_bit_identical_alone_in_a_batch_and_under_chunked_prefill():
    prompt_a, prompt_b = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]
    whole = fresh_model()
    alone = toy_forward(whole, step_input([(0, 0, prompt_a)]))
    chunked = fresh_model()
    toy_forward(chunked, step_input([(1, 0, prompt_a[:3])]))
    toy_forward(chunked, step_input([(1, 3, prompt_a[3:5]), (2, 0, prompt_b)]))
    batched = toy_forward(chunked, step_input([(3, 0, [5]), (1, 5, prompt_a[5:]), (2, 4, [11])]))
    assert torch.equal(alone[0], batched[1])
    assert batched.shape == (3, 128) and batched.dtype == torch.float32


def test_output_depends_on_the_whole_history():
    a, b = fresh_model(), fresh_model()
    la = toy_forward(a, step_input([(0, 0, [1, 2, 3, 4])]))
    lb = toy_forward(b, step_input([(0, 0, [9, 2, 3, 4])]))  # only the first token differs
    assert not torch.equal(la, lb)


def test_a_row_that_skips_positions_is_refused_and_reset_slot_reseeds():
    model = fresh_model()
    toy_forward(model, step_input([(0, 0, [1, 2])]))
    with pytest.raises(
        ContractViolation, match="row 0 starts slot 0 at position 5 but only 2 positions were fed"
    ):
        toy_forward(model, step_input([(0, 5, [3])]))
    model.reset_slot(0)
    again = toy_forward(model, step_input([(0, 0, [1, 2])]))
    assert torch.equal(again, toy_forward(fresh_model(), step_input([(0, 0, [1, 2])])))


def test_every_forward_agrees_on_fresh_host_ids():
    outs = [
        f(fresh_model(), step_input([(0, 0, [5, 6, 7])]))
        for f in (toy_forward, toy_forward_host_ids, toy_forward_placeholder_buffer)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_save_and_load_round_trip(tmp_path):
    factory = toy_factory(seed=3, eos_token_id=7)
    model = factory.build_preset("toylm")
    factory.save(model, tmp_path)
    loaded = factory.load(tmp_path, device="cpu")
    assert loaded.eos_token_id == 7 and torch.equal(loaded.lm_head, model.lm_head)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embed": "wrong"}, "embed must be one of"),
        ({"vocab_size": 1}, "vocab_size must be an int >= 2"),
        ({"eos_token_id": 500}, r"eos_token_id must be None or in \[0, 128\)"),
    ],
)
def test_bad_toy_configs(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        toy_factory(**kwargs).build_preset("toylm")
