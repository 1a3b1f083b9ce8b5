"""What a newcomer meets at the edges of the LLM API: each mistake named, each harmless option taken."""

from __future__ import annotations

import json

import pytest
import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractViolation, ForwardInput, entry_point
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, ModelFactory, SamplingParams


def test_a_directory_whose_architecture_no_factory_serves_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match=r"config.json names architecture 'GPT2LMHeadModel', which no registered ModelFactory serves") as exc:
        LLM(str(tmp_path))
    assert str(tmp_path) in str(exc.value)


@pytest.mark.parametrize("use_tqdm", [True, False])
def test_vllms_progress_bar_option_is_taken_and_changes_nothing(use_tqdm):
    llm = LLM(toy_factory())
    out = llm.generate([[1, 2]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=use_tqdm)
    assert len(out[0].token_ids) == 2
    with pytest.raises(ConfigError, match=r"generate\(use_tqdm=...\) is not supported"):
        llm.generate([[1, 2]], use_tqdm="yes")


def test_a_built_model_names_the_member_it_lacks():
    base = toy_factory()

    def build(config, *, device, seed):
        model = base.build(config, device=device, seed=seed)
        model.reset_slot = None  # a slot reset it cannot do
        return model

    with pytest.raises(ConfigError, match=r"lacks reset_slot \(a ServableModel has"):
        LLM(ModelFactory(architectures=("LacksResetLM",), forward=base.forward, build=build, presets=base.presets))


@entry_point
def _integer_logits(model: object, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    return torch.zeros(inp.logits_indices.shape[0], model.vocab_size, dtype=torch.long)


def test_a_wrong_return_dtype_is_one_sentence_without_the_argument_dump():
    base = toy_factory()
    llm = LLM(ModelFactory(architectures=("IntegerLogitsLM",), forward=_integer_logits, build=base.build, presets=base.presets))
    with pytest.raises(ContractViolation) as exc:
        llm.generate([[1, 2]], SamplingParams(max_tokens=1))
    message = str(exc.value)
    assert "Expected type: Float[Tensor, 'num_logits vocab']" in message and "Fix:" in message
    assert "Called with parameters" not in message and "{" not in message


def test_numpy_and_tensor_integers_are_taken_wherever_ids_and_counts_are() -> None:
    """Prompts took 1-D tensors and numpy ints, counts took numpy ints; the engine seed and the stop
    ids refused them."""
    import numpy as np

    llm = LLM(toy_factory(), seed=np.int64(3))
    assert llm.generate([[1, 2]], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids
    params = SamplingParams(stop_token_ids=torch.tensor([5, 7]))
    assert params.stop_token_ids == (5, 7)
    with pytest.raises(ConfigError, match="stop_token_ids must be a sequence of token ids"):
        SamplingParams(stop_token_ids=torch.tensor([0.5]))
    with pytest.raises(ConfigError, match="seed must be an int >= 0"):
        LLM(toy_factory(), seed=np.float64(3))


def test_vllms_engine_form_of_add_request_is_refused_saying_the_engine_assigns_ids() -> None:
    llm = LLM(toy_factory())
    params = SamplingParams(max_tokens=2)
    for call in (
        lambda: llm.add_request("r0", [1, 2, 3], params),
        lambda: llm.add_request("r0", [1, 2, 3]),
        lambda: llm.add_request([1, 2, 3], params, request_id="r0"),
    ):
        with pytest.raises(ConfigError, match=r"takes \(prompt, params\) and returns the request id.*drop the request id"):
            call()
    assert llm.add_request([1, 2, 3], params) == 0
