"""Sampling parameters, validated once when they are made (vLLM's ``SamplingParams`` shape)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from tokenstate.contracts import ConfigError

__all__ = ["SamplingParams"]

# vLLM SamplingParams options tokenstate does not implement, with what to do instead. Options not
# listed here and not fields of SamplingParams are refused too, naming the supported ones.
# The value that means "off" in vLLM is accepted, so ``n=1`` or ``logprobs=None`` copied from vLLM
# code keeps working.
_VLLM_NEUTRAL: dict[str, object] = {
    "n": 1, "best_of": None, "min_tokens": 0, "logprobs": None, "prompt_logprobs": None,
    "stop": None, "min_p": 0.0, "skip_special_tokens": True, "detokenize": True,
}
_VLLM_ONLY: dict[str, str] = {
    "n": "tokenstate returns one completion per prompt; pass the prompt n times, each with its own seed",
    "best_of": "tokenstate returns one completion per prompt; pass the prompt several times with seeds",
    "min_tokens": "tokenstate never suppresses EOS or stop ids; use ignore_eos=True with max_tokens",
    "logprobs": "tokenstate returns token ids only; run the model's forward yourself for logprobs",
    "prompt_logprobs": "tokenstate returns token ids only; run the model's forward yourself",
    "stop": "tokenstate works on token ids, not text; pass stop_token_ids=[...]",
    "min_p": "use top_k or top_p",
    "skip_special_tokens": "tokenstate never detokenizes; token_ids are returned as sampled",
    "detokenize": "tokenstate never detokenizes; token_ids are returned as sampled",
}


def _require_int(name: str, value: object, *, minimum: int) -> int:
    # numpy integers are ints here too, as in prompts (a config or a tokenizer hands them over)
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"SamplingParams.{name} must be an int >= {minimum}, got {value!r}.")
    return int(value)


def _is_number(value: object) -> bool:
    """A real number as configs and numpy hand them over (``np.float32(0.7)`` included), not a bool."""
    return not isinstance(value, bool | np.bool_) and isinstance(value, int | float | np.integer | np.floating)


def _require_float(name: str, value: object, *, positive: bool = False) -> None:
    ok = _is_number(value) and math.isfinite(value) and (value > 0 or not positive)  # type: ignore[arg-type]
    if not ok:
        bound = "a finite number > 0" if positive else "a finite number"
        raise ConfigError(f"SamplingParams.{name} must be {bound}, got {value!r}.")


_MAX_TOP_K = 2**31 - 1  # the device keeps top_k as int32; any value >= the vocabulary keeps every token
_REPETITION_RANGE = (0.01, 100.0)
"""Beyond it a penalty overflows float32 logits (a logit divided by 1e-39 is inf, and inf - inf is
NaN) and sampling returns garbage; 1 is off, 1.1-1.3 is typical."""


def _token_ids(ids: object) -> tuple[int, ...] | None:
    """``ids`` as a tuple of ints >= 0 (any iterable of Python or numpy integers, read once), or
    ``None`` where it is not one (a bare int, a string, a bool among the ids)."""
    if isinstance(ids, torch.Tensor):  # a 1-D integer tensor, as prompts take
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            return None
        ids = ids.tolist()
    if isinstance(ids, int | str | bytes) or not isinstance(ids, Iterable):
        return None
    out = []
    for t in ids:
        if isinstance(t, bool | np.bool_) or not isinstance(t, int | np.integer) or t < 0:
            return None
        out.append(int(t))
    return tuple(out)


def _bad_words(words: object) -> tuple[tuple[int, ...], ...]:
    problem = (
        "SamplingParams.bad_words must be a sequence of non-empty token-id sequences (ids >= 0), "
        f"e.g. [[5], [7, 8]]; got {words!r}."
    )
    if words is None:  # vLLM's default
        return ()
    if isinstance(words, str | bytes) or not isinstance(words, Iterable):
        raise ConfigError(problem)
    checked = []
    for word in words:
        ids = _token_ids(word)
        if not ids:
            raise ConfigError(problem)
        checked.append(ids)
    return tuple(checked)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request's tokens.

    Attributes:
        max_tokens: tokens to generate at most (the request finishes with ``"length"``).
        temperature: ``0`` is greedy; ``> 0`` samples from ``softmax(logits / temperature)``.
        top_k: keep the ``top_k`` most likely tokens (``0`` keeps all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p``.
        seed: per-request seed; ``None`` derives one from the engine seed and the request's order,
            so a run is reproducible either way. The same seed gives the same tokens whatever the
            batch around the request and whether scheduling is synchronous or asynchronous.
        stop_token_ids: tokens that finish the request with ``"stop"`` (the stop token is kept in
            the output). Any iterable of ids (numpy's included) or a 1-D integer tensor; ``None`` (vLLM's default) is none.
        ignore_eos: keep generating past the model's EOS token.
        repetition_penalty: ``> 0``; ``1`` is off. Every token already in the prompt or the output
            has its logit divided by it when positive, multiplied by it when negative.
        presence_penalty: subtracted once from the logit of every token already generated; in
            ``[-2, 2]``, as in vLLM and the OpenAI API.
        frequency_penalty: subtracted from each token's logit once per time it was generated; in
            ``[-2, 2]``.
        bad_words: token-id sequences that must never be generated: a one-token word is always
            banned; a longer word bans its last token whenever the request's history — the
            prompt, then the output so far — ends with the word's other tokens, so a prefix may
            sit in the prompt (as in HF's ``NoBadWordsLogitsProcessor``; vLLM matches the output
            only). ``None`` (vLLM's default) is none. Words whose last tokens cover
            the whole vocabulary are refused when the request is added (a step could be left
            with nothing to sample).

    The penalties and ``bad_words`` read the request's history; the runner computes them from the
    token history held on the execution device, which always holds the real tokens (the host
    only learns a sampled token one step late), so they never read a placeholder.

    vLLM options without an equivalent here (``n``, ``best_of``, ``min_tokens``, ``logprobs``,
    ``prompt_logprobs``, ``stop``, ``min_p``, ...) are refused with a `ConfigError` that names
    what to do instead; their neutral values (``n=1``, ``min_tokens=0``, ``logprobs=None``) are
    accepted, so code written for vLLM keeps working where it means the same thing.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    bad_words: tuple[tuple[int, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_tokens", _require_int("max_tokens", self.max_tokens, minimum=1))
        object.__setattr__(self, "top_k", _require_int("top_k", self.top_k, minimum=0))
        if self.top_k > _MAX_TOP_K:
            raise ConfigError(
                f"SamplingParams.top_k must be at most {_MAX_TOP_K} (0, or any value >= the vocabulary, "
                f"keeps every token), got {self.top_k!r}."
            )
        if not _is_number(self.temperature) or not (0.0 <= self.temperature < float("inf")):
            raise ConfigError(
                f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got "
                f"{self.temperature!r}."
            )
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"SamplingParams.top_p must lie in (0, 1], got {self.top_p!r}.")
        if np.float32(self.top_p) == 0:  # sampling keeps top_p in float32: 0 there keeps no token
            raise ConfigError(
                f"SamplingParams.top_p={self.top_p!r} is 0 in float32, where sampling reads it; use at "
                "least 1e-38 (any top_p that small keeps just the most likely token)."
            )
        if self.seed is not None:
            object.__setattr__(self, "seed", _require_int("seed", self.seed, minimum=0))
            if self.seed >= 2**63:
                raise ConfigError(f"SamplingParams.seed must be < 2**63, got {self.seed!r}.")
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}.")
        stops = () if self.stop_token_ids is None else _token_ids(self.stop_token_ids)  # None: vLLM's default
        if stops is None:
            raise ConfigError(
                f"SamplingParams.stop_token_ids must be a sequence of token ids >= 0, got "
                f"{self.stop_token_ids!r}."
            )
        object.__setattr__(self, "stop_token_ids", stops)
        _require_float("repetition_penalty", self.repetition_penalty, positive=True)
        low, high = _REPETITION_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ConfigError(
                f"SamplingParams.repetition_penalty must lie in [{low}, {high:g}] (1 is off; beyond that "
                f"range it overflows float32 logits), got {self.repetition_penalty!r}."
            )
        for name in ("presence_penalty", "frequency_penalty"):
            _require_float(name, getattr(self, name))
            if not -2.0 <= getattr(self, name) <= 2.0:  # vLLM's and OpenAI's range
                raise ConfigError(f"SamplingParams.{name} must lie in [-2, 2], got {getattr(self, name)!r}.")
        object.__setattr__(self, "bad_words", _bad_words(self.bad_words))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def reads_history(self) -> bool:
        """Whether sampling depends on the request's earlier tokens (penalties or bad words)."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.bad_words)
        )


_FIELDS = tuple(f.name for f in fields(SamplingParams))


def _refuse_unknown_options(init):  # type: ignore[no-untyped-def]
    """Turn an unknown keyword (a vLLM option we lack, a typo) into a ConfigError, not a TypeError."""

    def checked_init(self: SamplingParams, *args: object, **kwargs: object) -> None:
        for name in [k for k in kwargs if k not in _FIELDS]:
            value = kwargs.pop(name)
            if name in _VLLM_NEUTRAL and value == _VLLM_NEUTRAL[name]:
                continue
            instead = _VLLM_ONLY.get(name, f"supported options: {', '.join(_FIELDS)}")
            raise ConfigError(f"SamplingParams({name}={value!r}) is not supported: {instead}.")
        if len(args) > len(_FIELDS):
            raise ConfigError(
                f"SamplingParams takes at most {len(_FIELDS)} arguments ({', '.join(_FIELDS)}); "
                f"got {len(args)} positional ones — pass options by keyword."
            )
        init(self, *args, **kwargs)

    # Not functools.wraps: copying init's annotations would make a type checker (beartype under
    # --tokenstate-checks) refuse a bad value before __post_init__ can say what is wrong with it.
    checked_init.__name__, checked_init.__qualname__ = init.__name__, init.__qualname__
    checked_init.__doc__ = init.__doc__
    checked_init.__signature__ = inspect.signature(init)  # type: ignore[attr-defined]
    return checked_init


SamplingParams.__init__ = _refuse_unknown_options(SamplingParams.__init__)  # type: ignore[method-assign]
