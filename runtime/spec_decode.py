"""Speculative decoding: a deterministic prompt-lookup (n-gram) proposer that runs on the device.

After a step samples, each sampling row proposes ``k`` drafts for its slot from the slot's device
token history (:attr:`~tokenstate.runtime.mirror.DeviceMirror.history`): find the most recent
earlier occurrence of the last ``ngram_size`` tokens and continue from there. It must run on the
device because on the async path the host does not know the newest token yet — the proposal's
length comes from the device's ``num_computed`` too, since only the device knows how many drafts the
verification just accepted.

* No match (or too short a history): the drafts repeat the newest token — valid ids, usually
  rejected, never skipped, so every row's draft count stays what the host scheduled.
* The continuation may run into the suffix itself (a repeating pattern): it is extended periodically,
  exactly what the lookup would propose once the earlier drafts were accepted.

The drafts land in ``draft_tokens[slot]``; the next row of the slot carries the first ``d <= k`` of
them (``d`` decided on the host, so the logits count per row is known without a device sync),
combine splices them in, and verification (:func:`~tokenstate.runtime.kernels.verify_drafts`)
accepts the longest prefix that equals the tokens the sampler drew from the target model's logits.

**Every request drafts, and drafts never change a token.** The sampler draws each logit's token as
it would without drafts: argmax for a greedy request; for a sampled one the counter-based draw of
(seed, output index), which does not depend on the step the logit runs in. A draft is accepted while
it equals that token, so each emitted token is the one plain decoding emits at its index, and the
first mismatch emits the sampled token itself. With a deterministic proposer this is rejection
sampling for a one-hot draft distribution — accept with probability ``p(draft)``, else draw from the
rest — with the two coupled through one draw, so it is exact, not just exact in distribution. The
logits processors see what plain decoding sees: before they run, the runner writes the step's
drafts into the device history at the positions they hold (verification then overwrites those
positions with the sampled tokens), and bad words are matched at every logit of a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tokenstate.contracts import ConfigError

__all__ = ["SPECULATIVE_METHODS", "SpeculativeConfig", "propose_ngram"]

SPECULATIVE_METHODS: tuple[str, ...] = ("ngram",)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """``LLM(speculative={"method": "ngram", "num_tokens": k, "ngram_size": g})``, validated.

    Drafts are proposed for every request, greedy or sampled, with or without penalties and bad
    words; drafted output equals plain output (see the module docstring).
    """

    method: str
    num_tokens: int
    ngram_size: int = 2

    @classmethod
    def parse(cls, value: object, *, model: str, supported: bool) -> SpeculativeConfig | None:
        if value is None:
            return None
        if not supported:
            raise ConfigError(
                f"model {model!r} does not support speculative decoding (its factory declares "
                "supports_speculative=False: recurrent state cannot roll back rejected drafts); "
                "drop speculative= for this model."
            )
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"LLM: speculative must be a dict like {{'method': 'ngram', 'num_tokens': 3}}, got "
                f"{value!r}."
            )
        unknown = sorted(set(value) - {"method", "num_tokens", "ngram_size"})
        if unknown:
            raise ConfigError(
                f"LLM: speculative has unknown keys {unknown}; valid: method, num_tokens, ngram_size."
            )
        method = value.get("method")
        if method not in SPECULATIVE_METHODS:
            raise ConfigError(
                f"LLM: speculative method {method!r} is not available; valid: "
                f"{', '.join(SPECULATIVE_METHODS)}."
            )
        for key, default in (("num_tokens", None), ("ngram_size", 2)):
            n = value.get(key, default)
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 15:
                raise ConfigError(f"LLM: speculative {key} must be an int in [1, 15], got {n!r}.")
        return cls(str(method), int(value["num_tokens"]), int(value.get("ngram_size", 2)))


def propose_ngram(
    history: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    *,
    ngram_size: int,
    num_drafts: int,
    length_bound: int,
) -> torch.Tensor:
    """``[rows, num_drafts]`` int32 drafts, one proposal per row.

    Args:
        history: ``[num_slots, max_model_len]`` int32 device token history.
        slots: ``[rows]`` int64, the slot of each proposing row.
        lengths: ``[rows]`` int64 (device), valid history length of each slot (``>= 1``).
        ngram_size: tokens matched (``>= 1``).
        num_drafts: drafts per row ``k`` (``>= 1``).
        length_bound: host-known bound ``>= max(lengths)``; columns beyond it are not read.
    """
    width = min(history.shape[1], max(length_bound, ngram_size + 1))
    past = history.index_select(0, slots)[:, :width]  # [rows, width] int32
    n = lengths.unsqueeze(1)  # [rows, 1]
    g = ngram_size
    offsets = torch.arange(g, device=history.device)  # [g]
    suffix = past.gather(1, (n - g + offsets).clamp(min=0))  # [rows, g]: the newest g tokens
    windows = past.unfold(1, g, 1)  # [rows, width - g + 1, g]
    start = torch.arange(windows.shape[1], device=history.device)  # [width - g + 1]
    # A match must end before the suffix starts being its own copy: start + g <= n - 1 leaves at
    # least one following token to propose.
    match = (windows == suffix.unsqueeze(1)).all(dim=2) & (start + g <= n - 1)  # [rows, starts]
    best = torch.where(match, start, -1).amax(dim=1, keepdim=True)  # [rows, 1], -1: no match
    period = (n - g - best).clamp(min=1)  # [rows, 1]: distance between the match and the suffix
    j = torch.arange(num_drafts, device=history.device)  # [k]
    source = torch.where(best >= 0, best + g + j % period, n - 1)  # [rows, k] history positions
    return past.gather(1, source)  # [rows, k] int32
