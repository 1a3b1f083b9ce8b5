"""What HF ``generate`` would take from a checkpoint beside its weights, said out loud.

A checkpoint's ``generation_config.json`` (or, without one, the legacy generation fields of its
``config.json``, which HF ``generate`` falls back to) may set a repetition penalty, sampling, an
n-gram ban... HF ``generate`` applies them to every call; tokenstate, like vLLM's offline ``LLM``
given explicit ``SamplingParams``, applies exactly what each request's ``SamplingParams`` says. So
that outputs never differ from HF's without a word, :func:`warn_on_generation_settings` warns once,
when the engine loads the directory, naming each setting that changes what HF generates, how to
ask for it here (where ``SamplingParams`` has it) and which ones tokenstate does not implement.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenstate.runtime import registry

__all__ = ["GenerationSettingsWarning", "warn_on_generation_settings"]


class GenerationSettingsWarning(UserWarning):
    """A checkpoint's generation settings that HF ``generate`` applies and tokenstate does not."""


# HF field -> (its neutral value, the SamplingParams option that does the same, or None)
_APPLIED_BY_HF: dict[str, tuple[object, str | None]] = {
    "repetition_penalty": (1.0, "repetition_penalty"),
    "bad_words_ids": (None, "bad_words"),
    "no_repeat_ngram_size": (0, None),
    "suppress_tokens": (None, None),
    "begin_suppress_tokens": (None, None),
    "min_new_tokens": (None, None),
    "min_length": (0, None),
    "num_beams": (1, None),
    "sequence_bias": (None, None),
    "forced_bos_token_id": (None, None),
    "forced_eos_token_id": (None, None),
    "encoder_repetition_penalty": (1.0, None),
    "exponential_decay_length_penalty": (None, None),
    "max_new_tokens": (None, "max_tokens"),
}
# applied by HF only with do_sample=true
_SAMPLING: dict[str, tuple[object, str | None]] = {
    "temperature": (1.0, "temperature"),
    "top_p": (1.0, "top_p"),
    "min_p": (None, None),
    "typical_p": (1.0, None),
    "epsilon_cutoff": (0.0, None),
    "eta_cutoff": (0.0, None),
}


def _settings(directory: Path) -> tuple[Path, Mapping[str, Any]] | None:
    generation = directory / "generation_config.json"
    if generation.is_file():
        return generation, registry.read_json_object(generation)
    config = directory / "config.json"
    return (config, registry.read_json_object(config)) if config.is_file() else None


def _non_neutral(fields: Mapping[str, Any], table: dict[str, tuple[object, str | None]]) -> list[tuple[str, object, str | None]]:
    return [
        (name, fields[name], option)
        for name, (neutral, option) in table.items()
        if name in fields and fields[name] not in (neutral, None, [], {})
    ]


def warn_on_generation_settings(directory: Path, model_eos: tuple[int, ...]) -> None:
    """Warn (:class:`GenerationSettingsWarning`) about the settings of ``directory`` that HF
    ``generate`` applies and tokenstate does not, and about a ``generation_config.json`` that names
    no ``eos_token_id`` (HF then stops only at its length limit; tokenstate at ``model_eos``)."""
    found = _settings(directory)
    if found is None:
        return
    source, fields = found
    applied = _non_neutral(fields, _APPLIED_BY_HF)
    if fields.get("do_sample") is True:  # HF samples, with its top_k of 50 unless the file says otherwise
        top_k = fields.get("top_k", 50)
        applied += [("do_sample", True, "temperature"), *_non_neutral(fields, _SAMPLING)]
        applied += [("top_k", top_k, "top_k")] if top_k not in (0, None) else []
    if applied:
        shown = ", ".join(f"{name}={value!r}" for name, value, _ in applied)
        options = dict.fromkeys(f"{option}=..." for _, _, option in applied if option is not None)
        missing = [name for name, _, option in applied if option is None]
        advice = f" Pass SamplingParams({', '.join(options)}) to apply the ones it has." if options else ""
        if missing:
            advice += f" Not implemented here: {', '.join(missing)}."
        warnings.warn(
            f"{source}: HF generate applies {shown} to every call; tokenstate applies only what each "
            f"request's SamplingParams says, so its tokens can differ from HF generate's.{advice}",
            GenerationSettingsWarning,
            stacklevel=4,
        )
    if source.name == "generation_config.json" and fields.get("eos_token_id") is None and model_eos:
        warnings.warn(
            f"{source} names no eos_token_id: HF generate then stops only at its length limit, while "
            f"tokenstate stops at config.json's {list(model_eos)} (pass ignore_eos=True to generate as "
            "HF does, or add eos_token_id to the file).",
            GenerationSettingsWarning,
            stacklevel=4,
        )
