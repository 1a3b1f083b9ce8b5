from __future__ import annotations

import os
import subprocess
import sys
import typing

import pytest
import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import (
    CHECK_MODES,
    ConfigError,
    ContractDefinitionError,
    ContractViolation,
    EntryPoint,
    ForwardInput,
    checks_mode,
    entry_point,
    get_checks_mode,
    set_checks_mode,
)


class TinyLM(torch.nn.Module):
    vocab_size = 11

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.head = torch.nn.Linear(4, 11)


@entry_point
def good_forward(model: TinyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    hidden = model.embed(inp.embedding_ids())  # [num_tokens, 4]
    return model.head(hidden[inp.logits_indices])


@entry_point(name="tests.wrong_rows")
def wrong_rows(model: TinyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    return torch.zeros(inp.num_logits + 1, 11)


@entry_point
def wrong_vocab(model: TinyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    return torch.zeros(inp.num_logits, 7)


@entry_point
def int_logits(model: TinyLM, inp: ForwardInput) -> Tensor:
    return torch.zeros(inp.num_logits, 11, dtype=torch.long)


def test_checked_forward_runs_in_every_mode(step):
    for mode in CHECK_MODES:
        with checks_mode(mode):
            assert good_forward(TinyLM(), step.forward_input()).shape == (3, 11)
    assert isinstance(good_forward, EntryPoint)
    assert good_forward.name.endswith("good_forward") and good_forward.__wrapped__.__name__ == "good_forward"


def test_wrong_argument_type_names_the_argument(step):
    with pytest.raises(ContractViolation, match=r"entry point .*good_forward: .*parameter 'model'"):
        good_forward("not a model", step.forward_input())
    with pytest.raises(ContractViolation, match=r"parameter 'inp'"):
        good_forward(TinyLM(), step.host())


@pytest.mark.parametrize("mode", ["boundary", "full"])
def test_returned_logits_rows_bound_to_logits_indices(step, mode):
    with checks_mode(mode), pytest.raises(
        ContractViolation, match=r"entry point tests.wrong_rows: .*expected float \[num_logits=3, vocab\]"
    ):
        wrong_rows(TinyLM(), step.forward_input())


def test_returned_vocab_bound_to_model(step):
    with pytest.raises(ContractViolation, match="vocab dim 7, but the model's vocab_size is 11"):
        wrong_vocab(TinyLM(), step.forward_input())


def test_integer_logits_refused(step):
    with pytest.raises(ContractViolation, match=r"returned logits torch.int64 \(3, 11\), expected float"):
        int_logits(TinyLM(), step.forward_input())


def test_boundary_mode_reproves_only_new_signatures(step, monkeypatch):
    calls = []
    real = good_forward._check_step_boundary
    monkeypatch.setattr(good_forward, "_check_step_boundary", lambda *a: calls.append(1) or real(*a))
    model = TinyLM()
    with checks_mode("boundary"):
        good_forward._proven.clear()
        for _ in range(5):
            good_forward(model, step.forward_input())
    assert len(calls) == 1
    with checks_mode("full"):
        for _ in range(3):
            good_forward(model, step.forward_input())
    assert len(calls) == 4


def test_boundary_mode_still_catches_a_changed_output_after_proof(step):
    flip = {"bad": False}

    @entry_point
    def sometimes_bad(model: TinyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
        return torch.zeros(inp.num_logits + (1 if flip["bad"] else 0), 11)

    sometimes_bad(TinyLM(), step.forward_input())
    flip["bad"] = True
    with pytest.raises(ContractViolation, match="expected float"):
        sometimes_bad(TinyLM(), step.forward_input())


def test_off_mode_checks_nothing(step):
    with checks_mode("off"):
        assert wrong_rows(TinyLM(), step.forward_input()).shape == (4, 11)


def test_shapes_bound_across_arguments_of_a_plain_function():
    @entry_point
    def scale(x: Float[Tensor, "n d"], y: Float[Tensor, " n"]) -> Float[Tensor, "n d"]:
        return x * y[:, None]

    assert scale(torch.ones(3, 2), torch.ones(3)).shape == (3, 2)
    with pytest.raises(ContractViolation, match=r"entry point .*scale"):
        scale(torch.ones(3, 2), torch.ones(4))


def test_unresolvable_annotations_are_a_definition_error(step):
    @entry_point
    def broken(model: NoSuchModel, inp: ForwardInput) -> Tensor:  # noqa: F821
        return torch.zeros(1)

    with pytest.raises(ContractDefinitionError, match="annotations cannot be resolved"):
        broken(TinyLM(), step.forward_input())


class CausalLM(typing.Protocol):  # not @runtime_checkable: isinstance() cannot check it
    vocab_size: int


@entry_point
def _protocol_annotated(model: CausalLM, inp: ForwardInput) -> Tensor:
    return torch.zeros(1)


def test_an_annotation_beartype_cannot_check_is_a_definition_error_that_says_what_to_do(step):
    with pytest.raises(ContractDefinitionError, match=r"entry point .*_protocol_annotated: cannot be checked: .*runtime_checkable"):
        _protocol_annotated(TinyLM(), step.forward_input())


def test_entry_point_refuses_non_functions():
    with pytest.raises(ContractDefinitionError, match="expected a plain forward function"):
        entry_point(good_forward)


def test_mode_switch_validates_values():
    with pytest.raises(ConfigError, match="'loud' is not a checks mode; valid values: off, boundary, full"):
        set_checks_mode("loud")
    set_checks_mode("FULL")
    assert get_checks_mode() == "full"


def test_mode_from_environment_and_bad_value_message():
    code = "from tokenstate.contracts import get_checks_mode; print(get_checks_mode())"
    env = dict(os.environ, TOKENSTATE_CHECKS="off")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "off"
    env["TOKENSTATE_CHECKS"] = "sometimes"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0
    assert "TOKENSTATE_CHECKS='sometimes' is not a checks mode; valid values: off, boundary, full" in bad.stderr


def test_once_a_forward_got_the_input_its_raw_buffer_is_refused_in_every_thread_for_good():
    import concurrent.futures

    from tokenstate.contracts import StaleHostTokensError
    from tokenstate.tools.demo import demo_step

    inp, _ = demo_step()  # a stale step: row 1 is a decode row
    raw = inp.host_tokens.placeholder_buffer()  # before the forward: what a combine step reads
    pool = concurrent.futures.ThreadPoolExecutor(1)
    seen = []

    @entry_point
    def forward(model: object, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
        seen.append(pool.submit(inp.host_tokens.placeholder_buffer).exception())  # off the forward's thread
        return torch.zeros(inp.logits_indices.shape[0], 8)

    forward(None, inp)
    assert isinstance(seen[0], StaleHostTokensError)
    with pytest.raises(StaleHostTokensError, match=r"placeholder_buffer\(\) in forward .*rows \[1\]"):
        pool.submit(inp.host_tokens.placeholder_buffer).result()  # kept for a later step: still refused
    inp.host_tokens._handed_to_forward(None)  # type: ignore[arg-type]  # one way: nothing clears it
    with pytest.raises(StaleHostTokensError):
        inp.host_tokens.placeholder_buffer()
    assert raw[4] == -1
    pool.shutdown()


@pytest.mark.parametrize("kind", ["partial", "callable instance"])
def test_a_forward_that_is_not_a_def_is_refused_by_name(kind):
    import functools

    from tokenstate.contracts import ContractDefinitionError

    class Forward:
        def __call__(self, model: object, inp: ForwardInput) -> Tensor: ...

    fn = functools.partial(lambda model, inp, scale: None, scale=2) if kind == "partial" else Forward()
    with pytest.raises(ContractDefinitionError, match=r"entry_point wraps a def .*; got a (partial|Forward) "
                       r"object: write a def that calls it and decorate that"):
        entry_point(fn)
