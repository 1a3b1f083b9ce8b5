from __future__ import annotations

import json

import pytest
import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ConfigError, ContractDefinitionError, ForwardInput, entry_point
from tokenstate.runtime import registry
from tokenstate.runtime.registry import ModelFactory


@entry_point
def _forward(model: torch.nn.Module, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    raise AssertionError("never called in registry tests")


def _build(config, *, device, seed):
    return torch.nn.Linear(1, 1)


@pytest.fixture
def factory():
    made = ModelFactory(
        architectures=("RegistryTestLM",), forward=_forward, build=_build, presets={"tiny-registry-test": {}}
    )
    registry.register(made)
    yield made
    registry.unregister(made)


def test_resolve_by_architecture_and_preset(factory):
    assert registry.resolve("RegistryTestLM") is factory
    assert registry.resolve("tiny-registry-test") is factory
    assert registry.resolve_preset("tiny-registry-test") is factory
    assert factory in registry.factories()
    assert factory.name == "RegistryTestLM" and factory.honors_device_token_ids is False


def test_duplicate_architecture_refused(factory):
    other = ModelFactory(architectures=("RegistryTestLM",), forward=_forward, build=_build)
    with pytest.raises(ContractDefinitionError, match="'RegistryTestLM' is already served by factory 'RegistryTestLM'"):
        registry.register(other)
    registry.register(factory)  # re-registering the same factory is idempotent


def test_duplicate_preset_refused(factory):
    other = ModelFactory(architectures=("OtherLM",), forward=_forward, build=_build, presets={"tiny-registry-test": {}})
    with pytest.raises(ContractDefinitionError, match="preset name 'tiny-registry-test' is already taken"):
        registry.register(other)
    with pytest.raises(ConfigError):
        registry.resolve("OtherLM")


def test_unchecked_forward_refused():
    def raw_forward(model, inp):
        return None

    with pytest.raises(ContractDefinitionError, match=r"is not a checked entry point; decorate it with @tokenstate\.contracts\.entry_point"):
        ModelFactory(architectures=("RawLM",), forward=raw_forward, build=_build)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"architectures": "LlamaForCausalLM"}, "must be a non-empty tuple of names"),
        ({"architectures": ()}, "must be a non-empty tuple of names"),
        ({"honors_device_token_ids": "yes"}, "honors_device_token_ids must be a bool"),
        ({"build": None}, "build must be callable"),
    ],
)
def test_malformed_factories_refused(kwargs, message):
    args = {"architectures": ("BadLM",), "forward": _forward, "build": _build} | kwargs
    with pytest.raises(ContractDefinitionError, match=message):
        ModelFactory(**args)


def test_register_refuses_non_factories():
    with pytest.raises(ContractDefinitionError, match="register\\(\\) takes a ModelFactory, got str"):
        registry.register("LlamaForCausalLM")


def test_unknown_architecture_lists_known_ones(factory):
    with pytest.raises(ConfigError, match=r"unknown architecture or model 'NopeLM'; registered architectures: .*RegistryTestLM"):
        registry.resolve("NopeLM")


def test_architecture_of_hf_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="needs an 'architectures' list"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert registry.architecture_of(tmp_path) == "LlamaForCausalLM"
