"""Sampling parameters, validated once when they are made (vLLM's ``SamplingParams`` shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenstate.contracts import ConfigError

__all__ = ["SamplingParams"]


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"SamplingParams.{name} must be an int >= {minimum}, got {value!r}.")


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
            the output).
        ignore_eos: keep generating past the model's EOS token.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _require_int("max_tokens", self.max_tokens, minimum=1)
        _require_int("top_k", self.top_k, minimum=0)
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or not (0.0 <= self.temperature < float("inf"))
        ):
            raise ConfigError(
                f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got "
                f"{self.temperature!r}."
            )
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, int | float)
            or not (0.0 < self.top_p <= 1.0)
        ):
            raise ConfigError(f"SamplingParams.top_p must lie in (0, 1], got {self.top_p!r}.")
        if self.seed is not None:
            _require_int("seed", self.seed, minimum=0)
            if self.seed >= 2**63:
                raise ConfigError(f"SamplingParams.seed must be < 2**63, got {self.seed!r}.")
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}.")
        stops = self.stop_token_ids
        if isinstance(stops, int | str) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stops
        ):
            raise ConfigError(
                f"SamplingParams.stop_token_ids must be a sequence of token ids >= 0, got {stops!r}."
            )
        object.__setattr__(self, "stop_token_ids", tuple(stops))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
