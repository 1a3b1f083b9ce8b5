"""The public engine: ``LLM(model, ...).generate(prompts, SamplingParams(...))``.

Everything a caller can get wrong (an unknown model, a bad setting, an empty or out-of-vocabulary
prompt, a prompt that does not fit the context, bad sampling parameters) is refused with a clear
:class:`~tokenstate.contracts.ConfigError` before any step runs. Every request is returned, in
prompt order; none is dropped or silently truncated.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import torch

from tokenstate.contracts import ConfigError
from tokenstate.runtime import registry
from tokenstate.runtime.outputs import EngineStats, RequestOutput
from tokenstate.runtime.params import SamplingParams
from tokenstate.runtime.registry import ModelFactory, ServableModel
from tokenstate.runtime.runner import ON_UNHONORED, ModelRunner, OnUnhonored
from tokenstate.runtime.scheduler import Request

__all__ = ["LLM"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"LLM: {name} must be a positive int, got {value!r}.")
    return value


def _device(device: torch.device | str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"LLM: device={device!r} is not a torch device (use 'cpu' or 'cuda')."
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"LLM: device={device!r} but CUDA is not available here; use device='cpu'."
        )
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"LLM: device={device!r} is not supported; use 'cpu' or 'cuda'.")
    return dev


def _first_preset(factory: ModelFactory) -> str:
    if not factory.presets:
        raise ConfigError(
            f"model {factory.name!r} has no embedded default config; pass a preset name or a path to "
            "an HF-format directory instead."
        )
    return next(iter(factory.presets))


def _load_model(
    model: ModelFactory | str | os.PathLike[str], device: torch.device
) -> tuple[ModelFactory, Any]:
    if isinstance(model, ModelFactory):
        return model, model.build_preset(_first_preset(model), device=device)
    if not isinstance(model, str | os.PathLike):
        raise ConfigError(
            f"LLM: model must be a registered name, a ModelFactory or a path, got {type(model).__name__}."
        )
    path = Path(model)
    if path.is_dir():
        factory = registry.resolve(registry.architecture_of(path))
        if factory.load is None:
            raise ConfigError(
                f"model {factory.name!r} cannot load weights from a directory ({path})."
            )
        return factory, factory.load(path, device=device)
    name = os.fspath(model)
    factory = registry.resolve(name)
    preset = name if name in factory.presets else _first_preset(factory)
    return factory, factory.build_preset(preset, device=device)


class LLM:
    """An engine over one model, with synchronous or asynchronous scheduling.

    Args:
        model: a registered architecture or preset name (``"tiny-llama"``), a
            :class:`~tokenstate.runtime.ModelFactory` (built from its first preset), or a path to
            an HF-format directory (``config.json`` + safetensors).
        async_scheduling: prepare step N+1 before step N's tokens reach the host (the device
            splices them in). ``False`` runs every step on fresh host ids.
        device: execution device, ``"cpu"`` or ``"cuda"``.
        max_num_seqs: requests running at once (also the number of slots).
        max_num_batched_tokens: token budget per step; longer prompts are prefilled in chunks.
        seed: engine seed, from which requests without their own seed derive one.
        on_unhonored: for a forward that did not declare ``honors_device_token_ids=True``, on an
            async step with spliced rows: ``"fallback"`` runs that step on the synchronous host
            path; ``"refuse"`` raises, naming the model.
    """

    def __init__(
        self,
        model: ModelFactory | str | os.PathLike[str],
        *,
        async_scheduling: bool = True,
        device: torch.device | str = "cpu",
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 256,
        seed: int = 0,
        on_unhonored: OnUnhonored = "fallback",
    ) -> None:
        if not isinstance(async_scheduling, bool):
            raise ConfigError(f"LLM: async_scheduling must be a bool, got {async_scheduling!r}.")
        if on_unhonored not in ON_UNHONORED:
            raise ConfigError(
                f"LLM: on_unhonored={on_unhonored!r} is not a policy; valid: {', '.join(ON_UNHONORED)}."
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"LLM: seed must be an int >= 0, got {seed!r}.")
        dev = _device(device)
        self.factory, self.model = _load_model(model, dev)
        if not isinstance(self.model, ServableModel):
            raise ConfigError(
                f"model {self.factory.name!r}: the built model lacks vocab_size / max_model_len / "
                "eos_token_id / allocate_slots / reset_slot (see ServableModel)."
            )
        self.seed = seed
        self.stats = EngineStats()
        self._num_requests = 0
        self._runner = ModelRunner(
            self.factory,
            self.model,
            device=dev,
            async_scheduling=async_scheduling,
            on_unhonored=on_unhonored,
            max_num_seqs=_positive_int("max_num_seqs", max_num_seqs),
            max_num_batched_tokens=_positive_int("max_num_batched_tokens", max_num_batched_tokens),
            stats=self.stats,
        )

    @property
    def async_scheduling(self) -> bool:
        return self._runner.async_scheduling

    def _derived_seed(self) -> int:
        digest = hashlib.blake2b(
            f"{self.seed}:{self._num_requests}".encode(), digest_size=8
        ).digest()
        return int.from_bytes(digest, "little") >> 2

    def _validate_prompt(self, index: int, prompt: object) -> tuple[int, ...]:
        vocab, max_len = self.model.vocab_size, self.model.max_model_len
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
            raise ConfigError(
                f"prompt {index}: expected a list of token ids, got {type(prompt).__name__} (tokenize "
                "text before calling generate)."
            )
        if len(prompt) == 0:
            raise ConfigError(f"prompt {index} is empty; every prompt needs at least one token.")
        if len(prompt) >= max_len:
            raise ConfigError(
                f"prompt {index} has {len(prompt)} tokens but model {self.factory.name!r} has a context "
                f"of max_model_len={max_len}, which must also hold at least one generated token; "
                f"shorten the prompt to at most {max_len - 1} tokens."
            )
        bad = [
            t
            for t in prompt
            if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab
        ]
        if bad:
            raise ConfigError(
                f"prompt {index}: token ids {bad[:8]} are outside the vocabulary [0, {vocab}) of model "
                f"{self.factory.name!r}."
            )
        return tuple(int(t) for t in prompt)

    def _validate_params(self, index: int, params: object) -> SamplingParams:
        if not isinstance(params, SamplingParams):
            raise ConfigError(
                f"sampling {index}: expected SamplingParams, got {type(params).__name__}."
            )
        vocab = self.model.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise ConfigError(
                f"sampling {index}: stop_token_ids {bad} are outside the vocabulary [0, {vocab}) and "
                "could never be generated."
            )
        return params

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one :class:`RequestOutput` per prompt, in order."""
        if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
            raise ConfigError(
                f"generate: prompts must be a list of token-id lists, got {type(prompts).__name__}."
            )
        checked = [self._validate_prompt(i, p) for i, p in enumerate(prompts)]
        if sampling is None:
            sampling = SamplingParams()
        if isinstance(sampling, SamplingParams):
            per_request: list[SamplingParams] = [self._validate_params(0, sampling)] * len(checked)
        elif isinstance(sampling, Sequence) and len(sampling) == len(checked):
            per_request = [self._validate_params(i, p) for i, p in enumerate(sampling)]
        else:
            raise ConfigError(
                f"generate: sampling must be one SamplingParams or a list of {len(checked)} (one per "
                f"prompt), got {sampling!r}."
            )
        requests = []
        for i, (prompt, params) in enumerate(zip(checked, per_request, strict=True)):
            seed = params.seed if params.seed is not None else self._derived_seed()
            self._num_requests += 1
            requests.append(Request(i, prompt, params, seed, self.model.eos_token_id))
        return self._run(requests)

    def _run(self, requests: list[Request]) -> list[RequestOutput]:
        runner = self._runner
        for req in requests:
            runner.scheduler.add(req)
        outputs: dict[int, RequestOutput] = {}
        try:
            while runner.scheduler.has_unfinished or runner.has_pending:
                for req in runner.step():
                    outputs[req.request_id] = req.to_output()
        except BaseException:
            runner.abort()
            raise
        self.stats.finished_requests += len(outputs)
        return [outputs[req.request_id] for req in requests]
