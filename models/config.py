"""Validation of HF-style model configs, before a single tensor is allocated.

A config dict comes from a user, a preset or a checkpoint's ``config.json``; any of them can be
wrong. :class:`ConfigSchema` checks every known field's type and range, refuses fields it does not
know (a typo such as ``num_hidden_layer`` must not silently fall back to a default), and reports
*all* problems in one :class:`~tokenstate.contracts.ConfigError`. HF's generic bookkeeping fields
(``transformers_version``, ``dtype``, ``use_cache``, …) are accepted and ignored.

Each model describes its fields once (a tuple of :class:`Field`) and adds cross-field rules
(heads dividing the hidden size, …) through :meth:`ConfigSchema.parse`'s ``checks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tokenstate.contracts import ConfigError

__all__ = [
    "HF_BOOKKEEPING_FIELDS",
    "REQUIRED",
    "ConfigSchema",
    "Field",
    "divides",
    "special_token_rules",
]

REQUIRED: Final = object()
"""Default marker of a field the config must spell out."""

# Generic PreTrainedConfig fields that say nothing about the math of the forward pass; accepted
# (their types are not ours to police) and dropped.
HF_BOOKKEEPING_FIELDS: Final[frozenset[str]] = frozenset(
    {
        "_name_or_path", "add_cross_attention", "architectures", "attention_dropout", "auto_map",
        "bad_words_ids", "chunk_size_feed_forward", "cross_attention_hidden_size",
        "decoder_start_token_id", "diversity_penalty", "do_sample", "dtype", "early_stopping",
        "encoder_no_repeat_ngram_size", "finetuning_task", "forced_bos_token_id",
        "forced_eos_token_id", "id2label", "initializer_range", "is_decoder", "is_encoder_decoder",
        "label2id", "length_penalty", "max_length", "min_length", "model_type",
        "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_return_sequences",
        "output_attentions", "output_hidden_states", "output_scores", "prefix", "pretraining_tp",
        "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty",
        "return_dict", "return_dict_in_generate", "sep_token_id", "suppress_tokens",
        "task_specific_params", "temperature", "tf_legacy_loss", "tie_encoder_decoder", "tokenizer_class",
        "top_k", "top_p", "torch_dtype", "torchscript", "transformers_version", "typical_p",
        "use_bfloat16", "use_cache", "use_return_dict",
    }
)


@dataclass(frozen=True, slots=True)
class Field:
    """One config field: accepted types, default, and an inclusive numeric range.

    ``kind`` lists accepted Python types; ``bool`` is never accepted where only ``int`` is (JSON
    ``true`` is not a layer count). ``None`` in ``kind`` means the field may be null.
    """

    name: str
    kind: tuple[type | None, ...]
    default: Any = REQUIRED
    minimum: int | float | None = None
    maximum: int | float | None = None

    def check(self, value: Any) -> str | None:
        """A problem description, or ``None`` when ``value`` is acceptable."""
        if value is None:
            return None if None in self.kind else f"{self.name}: must not be null"
        accepted = tuple(k for k in self.kind if k is not None)
        type_ok = isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted)
        # JSON has one number type: an integral float is fine where a float is expected.
        if not type_ok and float in accepted and isinstance(value, int) and not isinstance(value, bool):
            type_ok = True
        if not type_ok:
            names = " or ".join("null" if k is None else k.__name__ for k in self.kind)
            return f"{self.name}: expected {names}, got {type(value).__name__} {value!r}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return f"{self.name}: must be finite, got {value!r}"
            if self.minimum is not None and value < self.minimum:
                return f"{self.name}: must be >= {self.minimum!r}, got {value!r}"
            if self.maximum is not None and value > self.maximum:
                return (
                    f"{self.name}: must be <= {self.maximum!r} (larger is beyond what this reference "
                    f"implementation serves), got {value!r}"
                )
        return None


Check = Callable[[dict[str, Any]], Iterable[str]]
"""A cross-field rule: receives the parsed values, yields problem descriptions."""


def divides(divisor: str, dividend: str) -> Check:
    """Rule: field ``divisor`` divides field ``dividend`` (e.g. kv heads divide attention heads)."""

    def rule(values: dict[str, Any]) -> Iterable[str]:
        a, b = values.get(divisor), values.get(dividend)
        if isinstance(a, int) and isinstance(b, int) and a > 0 and b % a:
            yield f"{dividend}={b} is not a multiple of {divisor}={a}"

    return rule


def special_token_rules(values: dict[str, Any]) -> Iterable[str]:
    """Rule: ``pad_token_id``, ``bos_token_id`` and every ``eos_token_id`` lie in the vocabulary
    (an EOS the model can never sample, or a negative id, would be taken silently)."""
    vocab = values["vocab_size"]
    for field in ("pad_token_id", "bos_token_id"):
        token = values.get(field)
        if token is not None and not 0 <= token < vocab:
            yield f"{field}={token} lies outside the vocabulary [0, {vocab}); set it or null it"
    eos = values.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < vocab for e in eos_list):
        yield f"eos_token_id: ids must lie in [0, vocab_size={vocab}), got {eos!r}"


@dataclass(frozen=True)
class ConfigSchema:
    """The accepted fields of one architecture's config."""

    model: str  # for messages: "LlamaForCausalLM"
    fields: tuple[Field, ...]
    ignored: frozenset[str] = HF_BOOKKEEPING_FIELDS

    def parse(self, config: Mapping[str, Any], *, checks: Iterable[Check] = ()) -> dict[str, Any]:
        """Validated values for every field (defaults filled in); one ConfigError lists all problems."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"{self.model}: a config must be a dict, got {type(config).__name__}.")
        known = {f.name: f for f in self.fields}
        problems: list[str] = []
        values: dict[str, Any] = {}
        for field in self.fields:
            if field.name in config:
                problem = field.check(config[field.name])
                if problem:
                    problems.append(problem)
                else:
                    values[field.name] = config[field.name]
            elif field.default is REQUIRED:
                problems.append(f"{field.name}: required, missing")
            else:
                values[field.name] = field.default
        unknown = sorted(k for k in config if k not in known and k not in self.ignored)
        problems += [f"{k}: unknown field for {self.model} (a typo?)" for k in unknown]
        if not problems:
            for rule in checks:
                problems.extend(rule(values))
        if problems:
            raise ConfigError(
                f"{self.model} config refused before allocating anything: " + "; ".join(problems)
                + ". Fix the config (config.json or the dict passed to build)."
            )
        return values
