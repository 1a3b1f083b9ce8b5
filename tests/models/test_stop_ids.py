"""Stop ids as HF checkpoints give them: ``eos_token_id`` may be a list (Llama-3-Instruct lists three),
and ``generation_config.json``'s ``eos_token_id`` is what HF ``generate`` stops on."""

from __future__ import annotations

import json

import pytest

from tokenstate.contracts import ConfigError
from tokenstate.models import kimi_linear, llama, nemotron_h
from tokenstate.runtime import LLM, SamplingParams

PROMPT = [5, 9, 13, 2, 7]
FAMILIES = {
    "tiny-llama": (llama.save, "eos_token_id"),
    "tiny-nemotron-h": (nemotron_h.save_nemotron_h, "eos_token_id"),
    "tiny-kimi-linear": (kimi_linear.save, "eos_token_id"),
}


def _greedy(llm: LLM, **params) -> tuple[list[int], str]:
    (out,) = llm.generate([PROMPT], SamplingParams(max_tokens=12, **params))
    return list(out.token_ids), out.finish_reason


def _checkpoint(preset: str, tmp_path):
    save, _ = FAMILIES[preset]
    llm = LLM(preset, async_scheduling=False)
    plain, _ = _greedy(llm, ignore_eos=True)
    directory = tmp_path / preset
    save(llm.model, directory)
    return directory, plain


def _set(file, key, value):
    data = json.loads(file.read_text()) if file.exists() else {}
    data[key] = value
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_every_id_of_an_eos_list_stops_a_request(preset, tmp_path):
    directory, plain = _checkpoint(preset, tmp_path)
    stop_at = next(i for i in range(2, len(plain)) if plain[i] not in plain[:i])  # its first occurrence
    unused = next(t for t in range(3, 500) if t not in plain)
    _set(directory / "config.json", "eos_token_id", [unused, plain[stop_at]])
    tokens, reason = _greedy(LLM(directory, async_scheduling=False))
    assert (tokens, reason) == (plain[: stop_at + 1], "stop")


def test_generation_config_eos_ids_are_what_generate_stops_on(tmp_path):
    directory, plain = _checkpoint("tiny-llama", tmp_path)
    stop_at = next(i for i in range(2, len(plain)) if plain[i] not in plain[:i])
    unused = next(t for t in range(3, 500) if t not in plain)
    _set(directory / "config.json", "eos_token_id", unused)
    _set(directory / "generation_config.json", "eos_token_id", [unused, plain[stop_at]])
    for async_scheduling in (False, True):
        assert _greedy(LLM(directory, async_scheduling=async_scheduling)) == (plain[: stop_at + 1], "stop")
    _set(directory / "generation_config.json", "eos_token_id", [unused, 10**9])
    with pytest.raises(ConfigError, match=r"generation_config.json: eos_token_id .*1000000000"):
        LLM(directory)


def test_generation_settings_hf_applies_and_tokenstate_does_not_are_named(tmp_path):
    """HF generate applies a checkpoint's generation settings to every call; tokenstate applies
    each request's SamplingParams. Where the two would differ, loading says so, never silently."""
    from tokenstate.runtime.generation_settings import GenerationSettingsWarning

    directory, _ = _checkpoint("tiny-llama", tmp_path)
    generation = directory / "generation_config.json"
    _set(generation, "eos_token_id", 2)
    _set(generation, "repetition_penalty", 1.5)
    _set(generation, "no_repeat_ngram_size", 3)
    with pytest.warns(GenerationSettingsWarning, match=r"repetition_penalty=1.5, no_repeat_ngram_size=3 .*"
                      r"SamplingParams\(repetition_penalty=\.\.\.\) to apply the ones it has\. Not implemented here: "
                      r"no_repeat_ngram_size"):
        LLM(directory, async_scheduling=False)
    generation.unlink()  # without the file HF falls back to config.json's legacy fields
    _set(directory / "config.json", "do_sample", True)
    _set(directory / "config.json", "temperature", 0.6)
    with pytest.warns(GenerationSettingsWarning, match=r"config.json: HF generate applies do_sample=True, "
                      r"temperature=0.6, top_k=50 .*SamplingParams\(temperature=\.\.\., top_k=\.\.\.\)"):
        LLM(directory, async_scheduling=False)


def test_a_generation_config_without_eos_is_named(tmp_path):
    from tokenstate.runtime.generation_settings import GenerationSettingsWarning

    directory, _ = _checkpoint("tiny-llama", tmp_path)
    _set(directory / "config.json", "eos_token_id", 3)
    _set(directory / "generation_config.json", "bos_token_id", 1)
    with pytest.warns(GenerationSettingsWarning, match=r"names no eos_token_id: HF generate then stops only "
                      r"at its length limit, while tokenstate stops at config.json's \[3\]"):
        LLM(directory, async_scheduling=False)


def test_neutral_generation_settings_warn_nothing(tmp_path, recwarn):
    directory, _ = _checkpoint("tiny-llama", tmp_path)
    _set(directory / "generation_config.json", "eos_token_id", 2)
    _set(directory / "generation_config.json", "repetition_penalty", 1.0)
    _set(directory / "generation_config.json", "temperature", 0.7)  # HF applies it only with do_sample
    LLM(directory, async_scheduling=False)
    assert not [w for w in recwarn if "generate" in str(w.message)]
