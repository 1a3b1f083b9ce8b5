"""Token gate: Kimi-Linear through ``tokenstate.runtime.LLM`` (sync and async) vs HF greedy.

Ten requests of mixed lengths (1..130 tokens) x 32 greedy tokens, four slots (so slots are reused)
and a 64-token step budget (so long prompts are prefilled in chunks and share steps with decodes).

Default tier: the HF oracle scores every generated sequence in one forward and each of our tokens
must be HF's argmax given the same prefix — if all are, HF's greedy ``generate`` yields exactly our
sequence, so this is the same gate at a fraction of the cost. The slow tier runs ``generate`` itself.
"""

from __future__ import annotations

import pytest
import torch

from tokenstate.models.kimi_linear import KIMI_LINEAR, save

transformers = pytest.importorskip("transformers")
runtime = pytest.importorskip("tokenstate.runtime")
if not hasattr(runtime, "LLM"):
    pytest.skip("tokenstate.runtime.LLM is not available yet", allow_module_level=True)

PROMPT_LENGTHS = (1, 3, 5, 9, 17, 33, 64, 130, 7, 2)
NEW_TOKENS = 32


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny ops: a second intra-op thread only adds contention on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gate_run(tmp_path_factory):
    """Our generations on both paths, and the preset's weights saved for the HF oracle."""
    g = torch.Generator().manual_seed(3)
    vocab = KIMI_LINEAR.presets["tiny-kimi-linear"]["vocab_size"]
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    params = runtime.SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    generated, stats = {}, {}
    for async_scheduling in (False, True):
        llm = runtime.LLM(
            KIMI_LINEAR, async_scheduling=async_scheduling, max_num_seqs=4, max_num_batched_tokens=64
        )
        generated[async_scheduling] = [list(o.token_ids) for o in llm.generate(prompts, params)]
        stats[async_scheduling] = llm.stats
    path = tmp_path_factory.mktemp("tiny-kimi-linear")
    save(llm.model, path)
    return prompts, generated, stats, path


def _report(matches: list[int]) -> str:
    return ", ".join(f"req{i}: {m}/{NEW_TOKENS}" for i, m in enumerate(matches))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_token_gate_matches_hf_greedy(gate_run, hf_oracle, async_scheduling):
    prompts, generated, stats, path = gate_run
    hf = hf_oracle.load(path)
    matches = []
    for prompt, tokens in zip(prompts, generated[async_scheduling], strict=True):
        assert len(tokens) == NEW_TOKENS
        logits = hf_oracle.logits(hf, prompt + tokens[:-1])  # [len(prompt) + 31, vocab]
        hf_choice = logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
        matches.append(sum(a == b for a, b in zip(hf_choice, tokens, strict=True)))
    assert matches == [NEW_TOKENS] * len(prompts), _report(matches)
    if async_scheduling:  # every decode step really took the device-token path
        assert stats[True].async_steps > 0 and stats[True].fallback_steps == 0
    assert generated[False] == generated[True]


@pytest.mark.slow
def test_token_gate_matches_hf_generate(gate_run, hf_oracle):
    prompts, generated, _, path = gate_run
    hf = hf_oracle.load(path)
    config = transformers.GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    matches = []
    for prompt, tokens in zip(prompts, generated[True], strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt) :].tolist()
        matches.append(sum(a == b for a, b in zip(ref, tokens, strict=True)))
    assert matches == [NEW_TOKENS] * len(prompts), _report(matches)
