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
