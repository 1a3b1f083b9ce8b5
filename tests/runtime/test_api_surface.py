"""What a vLLM user types: supported for real, or refused with one typed line naming the alternative."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import ConfigError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, CompletionOutput, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(toy_factory(), async_scheduling=True, max_num_seqs=4)


def test_generate_takes_vllms_sampling_params_keyword(llm):
    params = SamplingParams(max_tokens=5)
    by_keyword = llm.generate([[1, 2, 3]], sampling_params=params)
    assert by_keyword == llm.generate([[1, 2, 3]], params)
    assert len(by_keyword[0].token_ids) == 5


def test_outputs_have_vllms_completion_view(llm):
    out = llm.generate([[4, 5], [6]], SamplingParams(max_tokens=3))
    for o in out:
        assert o.outputs == (CompletionOutput(0, o.token_ids, o.finish_reason),)
        assert o.outputs[0].token_ids == o.token_ids


def test_generate_accepts_vllms_tokens_prompt_dict(llm):
    params = SamplingParams(max_tokens=4)
    assert llm.generate([{"prompt_token_ids": [7, 8]}], params) == llm.generate([[7, 8]], params)
    with pytest.raises(ConfigError, match=r"prompt 0: a dict prompt must hold only 'prompt_token_ids'"):
        llm.generate([{"prompt": "hello"}])


def test_unknown_generate_keyword_is_a_config_error_not_a_type_error(llm):
    with pytest.raises(ConfigError, match=r"^generate\(lora_request=\.\.\.\) is not supported; generate takes "
                       r"prompts and sampling_params=SamplingParams"):
        llm.generate([[1]], lora_request="adapter")


def test_a_flat_prompt_is_refused_with_the_nested_form(llm):
    with pytest.raises(ConfigError, match=r"got one flat list of ints; for a single prompt pass \[\[1, 2, 3, \.\.\.\]\]"):
        llm.generate([1, 2, 3, 4])


@pytest.mark.parametrize(
    ("option", "instead"),
    [
        ({"n": 2}, "pass the prompt n times, each with its own seed"),
        ({"min_tokens": 3}, "use ignore_eos=True with max_tokens"),
        ({"logprobs": 1}, "returns token ids only"),
        ({"stop": ["\n"]}, "pass stop_token_ids=[...]"),
        ({"typo_tokens": 1}, "supported options: max_tokens, temperature"),
    ],
)
def test_sampling_params_refuses_vllm_only_options_by_name(option, instead):
    ((name, value),) = option.items()
    with pytest.raises(ConfigError) as exc:
        SamplingParams(**option)
    message = str(exc.value)
    assert message.startswith(f"SamplingParams({name}={value!r}) is not supported: ")
    assert instead in message
    assert "\n" not in message.replace(repr(value), "")


def test_sampling_params_accepts_vllms_neutral_values():
    assert SamplingParams(max_tokens=3, n=1, min_tokens=0, logprobs=None) == SamplingParams(max_tokens=3)


def test_sampling_params_refuses_too_many_positional_arguments():
    with pytest.raises(ConfigError, match=r"pass options by keyword"):
        SamplingParams(*range(12))


def test_llm_dtype_auto_and_float32_run_and_others_are_refused():
    assert LLM(toy_factory(), dtype="auto").dtype == torch.float32
    assert LLM(toy_factory(), dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ConfigError, match=r"^LLM: dtype='bfloat16' is not supported; the reference models "
                       r"compute in float32 — use dtype='auto' or dtype='float32'\.$"):
        LLM(toy_factory(), dtype="bfloat16")


def test_vllm_engine_options_are_refused_naming_the_alternative():
    with pytest.raises(ConfigError, match=r"^LLM\(tensor_parallel_size=\.\.\.\) is not supported: tokenstate "
                       r"runs one device"):
        LLM(toy_factory(), tensor_parallel_size=2)
    with pytest.raises(ConfigError, match=r"^LLM\(max_num_seq=\.\.\.\) is not supported: supported options: "
                       r"model, async_scheduling, device"):
        LLM(toy_factory(), max_num_seq=2)


def test_float_prompt_ids_are_called_non_integers_not_out_of_vocabulary(llm):
    with pytest.raises(ConfigError, match=r"^prompt 0: token ids must be ints, got \[1\.0\] \(float\); "
                       r"convert them"):
        llm.generate([[1.0, 2]])
    with pytest.raises(ConfigError, match=r"outside the vocabulary \[0, 128\)"):
        llm.generate([[1, 500]])


def test_a_nonexistent_model_path_is_not_called_an_unknown_architecture(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=r"^LLM: model path '.*no-such-model' does not exist \(tokenstate "
                       r"never downloads from the Hub\); pass an existing HF-format directory"):
        LLM(str(missing))
    with pytest.raises(ConfigError, match=r"model path 'org/model' does not exist"):
        LLM("org/model")
    (tmp_path / "file.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is not a directory; pass an HF-format directory"):
        LLM(tmp_path / "file.bin")
    with pytest.raises(ConfigError, match=r"^unknown architecture or model 'nope'"):
        LLM("nope")
    for empty in ("", " "):  # Path("") is the current directory, which may hold a checkpoint
        with pytest.raises(ConfigError, match=r"^LLM: the model name is empty"):
            LLM(empty)


def test_a_model_with_a_context_of_one_token_is_refused_when_built():
    """A prompt needs a token and every request generates one: a context of 1 can serve nothing."""
    import dataclasses

    toy = toy_factory("OneTokenContextLM")

    def build(config, *, device, seed):
        model = toy.build(config, device=device, seed=seed)
        model.max_model_len = 1  # an HF config with max_position_embeddings=1
        return model

    with pytest.raises(ConfigError, match=r"context of 1 token\(s\) \(max_model_len\); serving needs at least 2"):
        LLM(dataclasses.replace(toy, build=build))
