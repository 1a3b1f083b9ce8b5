"""The model registry: which factory serves an architecture, and whether it honours device ids.

Models register themselves (``tokenstate.models`` on import; third-party packages through the
``tokenstate.models`` entry-point group, loaded on first lookup) — the runtime never imports a model
package by name. ``honors_device_token_ids`` is the opt-in the runner acts on: only a forward whose
factory declared it receives :class:`~tokenstate.contracts.DeviceTokens` on a step with spliced rows.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from tokenstate.contracts import (
    BatchLayout,
    ConfigError,
    ContractDefinitionError,
    EntryPoint,
    IndexPlan,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelFactory",
    "ServableModel",
    "factories",
    "load_plugins",
    "read_hf_config",
    "read_json_object",
    "register",
    "resolve",
    "resolve_directory",
    "resolve_preset",
    "unregister",
]

ENTRY_POINT_GROUP = "tokenstate.models"


@runtime_checkable
class ServableModel(Protocol):
    """What the runner needs from a built model (besides the factory's forward)."""

    vocab_size: int
    max_model_len: int
    eos_token_id: int | None  # a model may also set ``eos_token_ids`` (a tuple): every one stops a request

    def allocate_slots(self, num_slots: int) -> None:
        """Allocate per-slot KV/recurrent state for ``num_slots`` requests on the model's device."""

    def reset_slot(self, slot: int) -> None:
        """Re-seed one slot's state; called when a request is admitted (or re-admitted) to it."""


@dataclass(frozen=True, eq=False)
class ModelFactory:
    """How to build, load and run one family of architectures.

    Attributes:
        architectures: HF ``architectures`` names served (``config.json``'s ``architectures[0]``).
        forward: the checked entry point, called as ``forward(model, inp: ForwardInput)`` and
            returning float logits ``[num_logits, vocab]``.
        build: ``build(config: dict, *, device, seed) -> model`` — a model with seeded random weights
            from an HF-style config dict (validated before anything is allocated).
        load: ``load(path, *, device) -> model`` — an HF-format directory (config.json + safetensors).
        save: ``save(model, path)`` — write an HF-format directory.
        honors_device_token_ids: the forward reads ``inp.device_tokens`` whenever present.
        presets: embedded default configs by name (e.g. ``tiny-llama``), built with ``preset_seed``.
        supports_speculative: whether the model's state can roll back rejected draft tokens.
        plan_indices: ``plan_indices(model, layout: BatchLayout) -> IndexPlan`` — the index arrays
            the forward reads, built on the host; the runner uploads them with the step's inputs
            (one copy) and the forward finds them as ``inp.layout.indices``. ``None``: the forward
            needs no index tensor beyond :class:`~tokenstate.contracts.ForwardInput`'s own.
        name: a display name (defaults to the first architecture).
    """

    architectures: tuple[str, ...]
    forward: EntryPoint
    build: Callable[..., Any]
    load: Callable[..., Any] | None = None
    save: Callable[..., None] | None = None
    honors_device_token_ids: bool = False
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    preset_seed: int = 0
    supports_speculative: bool = False
    plan_indices: Callable[[Any, BatchLayout], IndexPlan] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        archs = self.architectures
        if isinstance(archs, str) or not archs or not all(isinstance(a, str) and a for a in archs):
            raise ContractDefinitionError(
                f"ModelFactory.architectures must be a non-empty tuple of names, got {archs!r}."
            )
        object.__setattr__(self, "architectures", tuple(archs))
        if not isinstance(self.name, str):
            raise ContractDefinitionError(f"ModelFactory.name must be a str, got {self.name!r}.")
        if not self.name:
            object.__setattr__(self, "name", self.architectures[0])
        if getattr(self.forward, "__beartype_wrapper", False) and isinstance(
            getattr(self.forward, "__wrapped__", None), EntryPoint
        ):
            # beartype's import hook over the user's package (pytest --tokenstate-checks-package)
            # wraps the entry point in a plain function: the entry point checks its own calls.
            object.__setattr__(self, "forward", self.forward.__wrapped__)
        if not isinstance(self.forward, EntryPoint):
            raise ContractDefinitionError(
                f"ModelFactory {self.name}: forward {self.forward!r} is not a checked entry point; "
                "decorate it with @tokenstate.contracts.entry_point."
            )
        for flag in ("honors_device_token_ids", "supports_speculative"):
            if not isinstance(getattr(self, flag), bool):  # a truthy "no" must not switch a feature on
                raise ContractDefinitionError(
                    f"ModelFactory {self.name}: {flag} must be a bool, got {getattr(self, flag)!r}."
                )
        if not isinstance(self.preset_seed, int) or isinstance(self.preset_seed, bool):
            raise ContractDefinitionError(f"ModelFactory {self.name}: preset_seed must be an int, got {self.preset_seed!r}.")
        if not isinstance(self.presets, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in self.presets.items()
        ):
            raise ContractDefinitionError(
                f"ModelFactory {self.name}: presets must map preset names to config dicts "
                f"({{'tiny-my-model': {{...}}}}), got {self.presets!r}."
            )
        if not callable(self.build):
            raise ContractDefinitionError(f"ModelFactory {self.name}: build must be callable.")
        for hook in ("load", "save", "plan_indices"):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                raise ContractDefinitionError(f"ModelFactory {self.name}: {hook} must be callable or None.")
        # How the runtime calls each one: refused here, not as a bare TypeError at serve time.
        _check_call(self.name, "forward", self.forward.__wrapped__, "forward(model, inp)", (None, None), {})
        _check_call(self.name, "build", self.build, "build(config, *, device, seed)", ({},), {"device": None, "seed": 0})
        if self.load is not None:
            _check_call(self.name, "load", self.load, "load(path, *, device)", ("",), {"device": None})
        if self.save is not None:
            _check_call(self.name, "save", self.save, "save(model, path)", (None, ""), {})
        if self.plan_indices is not None:
            _check_call(self.name, "plan_indices", self.plan_indices, "plan_indices(model, layout)", (None, None), {})

    def build_preset(self, preset: str, *, device: torch.device | str = "cpu") -> Any:
        """Build an embedded default model (deterministic weights from ``preset_seed``)."""
        return self.build(dict(self.presets[preset]), device=torch.device(device), seed=self.preset_seed)


def _check_call(factory: str, role: str, fn: Callable[..., Any], call: str, args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse ``fn`` where the runtime's call ``call`` could not bind to its signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ContractDefinitionError(
            f"ModelFactory {factory}: {role} {name}{signature} must take {call}, the way the runtime "
            f"calls it ({exc})."
        ) from None


_lock = threading.RLock()
_by_architecture: dict[str, ModelFactory] = {}
_by_preset: dict[str, ModelFactory] = {}
_plugins_loaded = False


def register(factory: ModelFactory) -> ModelFactory:
    """Register a factory for all its architectures and presets; duplicates are refused."""
    if not isinstance(factory, ModelFactory):
        raise ContractDefinitionError(f"register() takes a ModelFactory, got {type(factory).__name__}.")
    with _lock:
        for arch in factory.architectures:
            other = _by_architecture.get(arch)
            if other is not None and other is not factory:
                raise ContractDefinitionError(
                    f"architecture {arch!r} is already served by factory {other.name!r}; unregister it "
                    "first or give the new factory another architecture name."
                )
        for preset in factory.presets:
            other = _by_preset.get(preset) or _by_architecture.get(preset)
            if other is not None and other is not factory:
                raise ContractDefinitionError(
                    f"preset name {preset!r} is already taken by factory {other.name!r}."
                )
        for arch in factory.architectures:
            _by_architecture[arch] = factory
        for preset in factory.presets:
            _by_preset[preset] = factory
    return factory


def unregister(factory: ModelFactory) -> None:
    """Remove a factory (tests and plugins that replace a model)."""
    if not isinstance(factory, ModelFactory):  # a name would remove nothing, silently
        raise ContractDefinitionError(
            f"unregister takes the registered ModelFactory itself, got {factory!r}; keep the object "
            "you passed to register()."
        )
    with _lock:
        for table in (_by_architecture, _by_preset):
            for key in [k for k, v in table.items() if v is factory]:
                del table[key]


def load_plugins() -> None:
    """Import every module advertised in the ``tokenstate.models`` entry-point group, once."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:
                raise ContractDefinitionError(
                    f"model plugin {ep.name!r} ({ep.value}) failed to import: {exc}"
                ) from exc


def factories() -> list[ModelFactory]:
    """All registered factories, each once, in registration order."""
    load_plugins()
    with _lock:
        return list(dict.fromkeys(_by_architecture.values()))


def _known() -> str:
    return ", ".join(sorted(_by_architecture)) or "(none)"


def resolve(architecture: str) -> ModelFactory:
    """The factory serving an architecture name (``LlamaForCausalLM``) or a preset (``tiny-llama``)."""
    load_plugins()
    with _lock:
        factory = _by_architecture.get(architecture) or _by_preset.get(architecture)
        if factory is None:
            raise ConfigError(
                f"unknown architecture or model {architecture!r}; registered architectures: {_known()}; "
                f"presets: {', '.join(sorted(_by_preset)) or '(none)'}. Register a ModelFactory (its "
                "package imported first: `--module PKG` on the tokenstate command line, or a "
                "`tokenstate.models` entry point), or pass a path to an HF-format directory."
            )
        return factory


def resolve_preset(name: str) -> ModelFactory | None:
    """The factory that embeds preset ``name``, or ``None``."""
    load_plugins()
    with _lock:
        return _by_preset.get(name)


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of an HF-format directory, as a dict (clear error if absent or bad)."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory; expected an HF-format model directory.")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{directory}: no config.json; expected an HF-format model directory.")
    return read_json_object(config_file)


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON file holding one object (``config.json``, ``generation_config.json``), as a dict."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid UTF-8 JSON ({exc}).") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: must hold a JSON object, got {type(value).__name__}.")
    return value


def resolve_directory(path: str | Path) -> ModelFactory:
    """The factory serving the architecture an HF-format directory's config.json names."""
    architecture = architecture_of(path)
    load_plugins()
    with _lock:
        factory = _by_architecture.get(architecture)
    if factory is None:
        raise ConfigError(
            f"{Path(path) / 'config.json'} names architecture {architecture!r}, which no registered "
            f"ModelFactory serves (registered architectures: {_known()}); register a ModelFactory with "
            f"architectures=({architecture!r},), or convert the checkpoint to one of those."
        )
    return factory


def architecture_of(path: str | Path) -> str:
    """``architectures[0]`` of an HF-format directory's config.json (clear error if missing)."""
    archs = read_hf_config(path).get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise ConfigError(f"{Path(path) / 'config.json'}: needs an 'architectures' list naming the model class.")
    return archs[0]
