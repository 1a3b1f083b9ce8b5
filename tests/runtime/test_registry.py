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


@entry_point
def _forward_one_arg(inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    raise AssertionError("never called")


@entry_point
def _forward_extra_arg(model: torch.nn.Module, inp: ForwardInput, other: int) -> Float[Tensor, "num_logits vocab"]:
    raise AssertionError("never called")


def test_factory_signatures_that_fit_are_accepted():
    # keyword-only or defaulted extras, **kwargs and *args all still take the documented calls
    def build(config, device=None, seed=0, **extra):
        return torch.nn.Linear(1, 1)

    def load(path, **kwargs):
        return None

    @entry_point
    def forward(model: torch.nn.Module, inp: ForwardInput, *, scale: float = 1.0, **kwargs) -> Float[Tensor, "num_logits vocab"]:
        raise AssertionError("never called")

    made = ModelFactory(architectures=("FitLM",), forward=forward, build=build, load=load, save=lambda *a: None)
    assert made.presets == {} and made.supports_speculative is False


@pytest.fixture
def factory():
    made = ModelFactory(
        architectures=("RegistryTestLM",), forward=_forward, build=_build, presets={"tiny-registry-test": {}}
    )
    registry.register(made)
    yield made
    registry.unregister(made)


def test_unregister_takes_the_factory_not_its_name(factory):
    with pytest.raises(ContractDefinitionError, match="unregister takes the registered ModelFactory itself"):
        registry.unregister("RegistryTestLM")
    assert registry.resolve("RegistryTestLM") is factory  # nothing was removed


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
        ({"architectures": (1,)}, "must be a non-empty tuple of names"),
        ({"architectures": ("",)}, "must be a non-empty tuple of names"),
        ({"supports_speculative": "no"}, "supports_speculative must be a bool"),
        ({"supports_speculative": 1}, "supports_speculative must be a bool"),
        ({"load": 5}, "load must be callable or None"),
        ({"save": "path"}, "save must be callable or None"),
        ({"presets": [{"n_layers": 1}]}, "presets must map preset names to config dicts"),
        ({"presets": {"tiny": "cfg"}}, "presets must map preset names to config dicts"),
        ({"presets": {3: {}}}, "presets must map preset names to config dicts"),
        ({"preset_seed": "0"}, "preset_seed must be an int"),
        ({"name": 7}, "name must be a str"),
        ({"build": lambda config: None}, r"build .* must take build\(config, \*, device, seed\)"),
        ({"load": lambda path: None}, r"load .* must take load\(path, \*, device\)"),
        ({"save": lambda model: None}, r"save .* must take save\(model, path\)"),
        ({"plan_indices": lambda model: None}, r"plan_indices .* must take plan_indices\(model, layout\)"),
        ({"forward": _forward_one_arg}, r"forward .* must take forward\(model, inp\)"),
        ({"forward": _forward_extra_arg}, r"forward .* must take forward\(model, inp\)"),
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
    with pytest.raises(ConfigError, match=r"unknown architecture or model 'NopeLM'; registered architectures: .*RegistryTestLM.*--module PKG"):
        registry.resolve("NopeLM")


def test_architecture_of_hf_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid UTF-8 JSON"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="needs an 'architectures' list"):
        registry.architecture_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert registry.architecture_of(tmp_path) == "LlamaForCausalLM"
