"""Token gate: our engine (sync and async scheduling) vs HF ``generate``, greedy, token for token.

Mixed prompt lengths, a token budget that chunks the long prompts, and fewer slots than requests
(so slots are reused) — the async path embeds device-spliced ids on every decode step.
"""

from __future__ import annotations

import pytest
import torch

from tokenstate.models.llama import FACTORY, save

runtime = pytest.importorskip("tokenstate.runtime")
if not hasattr(runtime, "LLM"):  # pragma: no cover - only while the runner is being written
    pytest.skip("tokenstate.runtime.LLM does not exist yet; the gate needs the runner", allow_module_level=True)

MAX_TOKENS = 32


def prompts(count: int, vocab: int, seed: int, lengths: tuple[int, ...] = (1, 3, 7, 12, 19, 33, 48, 70, 5, 26, 2, 90)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = lengths[:count]
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(hf_model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture
def llama_registered():
    """Make ``LLM(path)`` resolve LlamaForCausalLM; undo only a registration made here."""
    try:
        runtime.resolve(FACTORY.architectures[0])
        yield
    except Exception:
        runtime.register(FACTORY)
        yield
        runtime.unregister(FACTORY)


def run_gate(
    model_arg, preset: str, count: int, seed: int, tmp_path, hf_oracle, *, budget: int = 64, lengths: tuple[int, ...] | None = None
) -> None:
    """Greedy tokens of both engines equal HF generate's for every request (EOS stops both)."""
    model = FACTORY.build_preset(preset)
    save(model, tmp_path)
    hf = hf_oracle.load(tmp_path)
    batch = prompts(count, model.vocab_size, seed) if lengths is None else prompts(count, model.vocab_size, seed, lengths)
    expected = [hf_greedy(hf, p) for p in batch]
    params = runtime.SamplingParams(max_tokens=MAX_TOKENS)
    for async_scheduling in (False, True):
        llm = runtime.LLM(model_arg(tmp_path), async_scheduling=async_scheduling, max_num_seqs=4, max_num_batched_tokens=budget)
        got = [list(o.token_ids) for o in llm.generate(batch, params)]
        matched = [sum(a == b for a, b in zip(g, e, strict=False)) for g, e in zip(got, expected, strict=True)]
        assert got == expected, (
            f"{preset} async={async_scheduling}: matched/total per request "
            f"{[f'{m}/{len(e)}' for m, e in zip(matched, expected, strict=True)]}"
        )
        if async_scheduling:
            assert llm.stats.async_steps > 0 and llm.stats.fallback_steps == 0


def test_tiny_llama_matches_hf_generate(tmp_path, hf_oracle):
    # LLM(factory) builds the factory's first preset: tiny-llama.
    run_gate(lambda _: FACTORY, "tiny-llama", 8, 0, tmp_path, hf_oracle)


def test_long_prompts_prefilled_whole_match_hf_generate(tmp_path, hf_oracle):
    # Prompts of up to 300 tokens in one chunk each: their prefill is attended in blocks of
    # PREFILL_BLOCK queries (the first causal, the others over the keys up to their own end).
    run_gate(lambda _: FACTORY, "tiny-llama", 3, 3, tmp_path, hf_oracle, budget=512, lengths=(300, 65, 129))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_gqa_checkpoint_directory_matches_hf_generate(seed, tmp_path, hf_oracle, llama_registered):
    run_gate(str, "tiny-llama-gqa", 12, seed, tmp_path, hf_oracle)
