"""Items of specs/stale-host-ids.md carried by the runtime, the routing checker and the token gate.

Owed tests exercise the API the capability will have (docs/design/interfaces.md, DESIGN.md §4, §6)
and import it inside the test body, so that today's ImportError/AttributeError is an expected
failure of the *call*, not a collection error. When a capability lands its test starts passing, the
run fails with "now passes", and the item moves to ``## Paid`` with a mutant.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch
from jaxtyping import Float

from tokenstate.contracts import (
    PLACEHOLDER,
    ContractViolation,
    ForwardInput,
    entry_point,
    stale_position_mask,
)
from tokenstate.runtime import ModelFactory

from .stale_host_ids_mutants import (
    async_branch_cuda_only,
    async_splices_wrong_token,
    delegation_blind,
    fallback_keeps_stale_host_ids,
    placeholder_clamped,
    raw_buffer_free_in_forwards,
    raw_buffer_free_in_worker_threads,
    refuse_policy_ignored,
    refuse_without_spliced_rows,
    twin_predicate_drifts,
)

PROMPTS = [[1, 17, 33, 5, 9], [1, 100, 4]]  # token ids inside the toy vocabulary (128)


def host_only_toy():
    """A toy model whose forward embeds host ids (the original bug) and did not opt in."""
    from tokenstate.models.toy import toy_factory

    return toy_factory("SpecHostOnlyToy", honors=False, embed="host")


def generate(model, *, async_scheduling: bool, max_tokens: int = 6, **engine_args):
    from tokenstate.runtime import LLM, SamplingParams

    llm = LLM(model, async_scheduling=async_scheduling, **engine_args)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [o.token_ids for o in outputs], llm.stats


@pytest.mark.paid("SHI-6", before=fallback_keeps_stale_host_ids)
def test_opt_in_fallback():
    async_tokens, stats = generate(host_only_toy(), async_scheduling=True)
    sync_tokens, _ = generate(host_only_toy(), async_scheduling=False)
    assert async_tokens == sync_tokens and all(len(t) == 6 for t in async_tokens)
    assert stats.fallback_steps > 0 and stats.sync_steps == 0


@pytest.mark.paid("SHI-7", before=refuse_policy_ignored)
def test_refuse_policy():
    with pytest.raises(ContractViolation, match=r"model 'SpecHostOnlyToy'.*spliced rows"):
        generate(host_only_toy(), async_scheduling=True, on_unhonored="refuse")


@pytest.mark.paid("SHI-8", before=refuse_without_spliced_rows)
def test_prefill_only_steps_never_refused():
    tokens, stats = generate(
        host_only_toy(), async_scheduling=True, max_tokens=1, on_unhonored="refuse"
    )
    assert [len(t) for t in tokens] == [1, 1]
    assert stats.fallback_steps == 0 and stats.async_steps > 0


class _VocabParallelEmbedding(torch.nn.Embedding):
    """vLLM's masking: an id outside this shard's range embeds as a zero row, without an error."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= 0) & (ids < self.num_embeddings)  # [num_tokens]
        return super().forward(ids.clamp(0, self.num_embeddings - 1)) * inside[:, None]


class _MaskedEmbeddingLM(torch.nn.Module):
    vocab_size, max_model_len, eos_token_id = 128, 64, None

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(15)
        self.embed = _VocabParallelEmbedding(128, 16)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(128, 16, generator=gen))
        self.head = torch.nn.Parameter(torch.randn(128, 16, generator=gen), requires_grad=False)  # [vocab, hidden]

    def allocate_slots(self, num_slots: int) -> None:
        """Stateless."""

    def reset_slot(self, slot: int) -> None:
        """Stateless."""


@entry_point
def _masked_raw_buffer_forward(model: _MaskedEmbeddingLM, inp: ForwardInput) -> Float[torch.Tensor, "num_logits vocab"]:
    hidden = model.embed(inp.host_tokens.placeholder_buffer().long())  # [num_tokens, hidden]
    return hidden[inp.logits_indices] @ model.head.T  # [num_logits, vocab]


def _masked_raw_buffer_model() -> ModelFactory:
    return ModelFactory(
        architectures=("SpecMaskedRawLM",), forward=_masked_raw_buffer_forward, honors_device_token_ids=True,
        presets={"tiny-spec-masked-raw": {}},
        build=lambda config, *, device, seed: _MaskedEmbeddingLM().to(device),
    )  # fmt: skip


@pytest.mark.paid("SHI-15", before=raw_buffer_free_in_forwards)
def test_a_forward_reading_the_raw_buffer_raises_whatever_it_embeds_with():
    from tokenstate.contracts import StaleHostTokensError

    with pytest.raises(StaleHostTokensError, match=r"placeholder_buffer\(\) in forward .*rows \[0, 1\]"):
        generate(_masked_raw_buffer_model(), async_scheduling=True)


_POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spec-forward-worker")


def _read_in_pool(inp: ForwardInput) -> torch.Tensor:
    return _POOL.submit(lambda: inp.host_tokens.placeholder_buffer()).result()


def _read_in_thread(inp: ForwardInput) -> torch.Tensor:
    read: list = []
    worker = threading.Thread(target=lambda: read.append(_capture(inp.host_tokens.placeholder_buffer)))
    worker.start()
    worker.join()
    (result,) = read
    if isinstance(result, BaseException):
        raise result
    return result


_PREVIOUS: list = []  # the host tokens of the step before, kept across steps as models keep state


def _read_previous_step_in_pool(inp: ForwardInput) -> torch.Tensor:
    previous = _PREVIOUS[-1] if _PREVIOUS else None
    _PREVIOUS[:] = [inp.host_tokens]
    if previous is not None:  # a "previous input token" feature, read off the forward's thread
        _POOL.submit(previous.placeholder_buffer).result()
    return inp.embedding_ids()


def _capture(read):  # a thread's exception, handed back to the forward that started it
    try:
        return read()
    except BaseException as exc:
        return exc


def _worker_thread_model(read) -> ModelFactory:
    @entry_point
    def forward(model: _MaskedEmbeddingLM, inp: ForwardInput) -> Float[torch.Tensor, "num_logits vocab"]:
        hidden = model.embed(read(inp).long())  # [num_tokens, hidden]: the buffer read off the forward's thread
        return hidden[inp.logits_indices] @ model.head.T  # [num_logits, vocab]

    return ModelFactory(
        architectures=("SpecWorkerThreadLM",), forward=forward, honors_device_token_ids=True,
        presets={"tiny-spec-worker-thread": {}},
        build=lambda config, *, device, seed: _MaskedEmbeddingLM().to(device),
    )  # fmt: skip


@pytest.mark.paid("SHI-16", before=raw_buffer_free_in_worker_threads)
@pytest.mark.parametrize(
    "read", [_read_in_pool, _read_in_thread, _read_previous_step_in_pool],
    ids=["thread-pool", "thread", "previous-step-in-a-thread-pool"],
)  # fmt: skip
def test_a_forward_reading_the_raw_buffer_in_another_thread_raises(read):
    from tokenstate.contracts import StaleHostTokensError

    _PREVIOUS.clear()
    with pytest.raises(StaleHostTokensError, match=r"placeholder_buffer\(\) in forward .*rows \[\d"):
        generate(_worker_thread_model(read), async_scheduling=True)


@pytest.mark.paid("SHI-9", before=placeholder_clamped)
def test_guarded_embedding_refuses_placeholders():
    from tokenstate.runtime.kernels.embedding import guarded_embedding

    weight = torch.randn(8, 4)  # [vocab, hidden]
    ids = torch.tensor([3, PLACEHOLDER, 7, 8], dtype=torch.int32)  # [num_tokens]
    with pytest.raises(ContractViolation, match=r"positions \[1, 3\]"):
        guarded_embedding(ids, weight)
    fresh = torch.tensor([3, 0, 7], dtype=torch.int32)  # [num_tokens]
    assert torch.equal(guarded_embedding(fresh, weight), weight[fresh.long()])


@pytest.mark.paid("SHI-10", before=twin_predicate_drifts)
def test_predicate_pinned_between_kernel_and_twin(monkeypatch):
    from tokenstate.runtime.kernels import combine

    # The real kernel on a GPU; on a CPU the Triton interpreter (its kernel module is first imported
    # on a CPU-only machine through this launcher, with the interpreter switched on).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")

    def i32(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    qsl, seq_lens, slots = i32([0, 3, 4, 6, 9]), i32([3, 10, 7, 14]), i32([4, 0, 2, 1])
    num_drafts = i32([0, 0, 0, 2])
    prefill_len = i32([9, 5, 7, 0, 5])  # [num_slots]
    last_sampled = i32([40, 41, 42, 43, 44])  # [num_slots]
    draft_tokens = i32([[50, 51], [52, 53], [54, 55], [56, 57], [58, 59]])  # [num_slots, 2]
    host = i32([PLACEHOLDER] * 9)  # [num_tokens] the uploaded host buffer: placeholders only
    cu_num_logits = i32([0, 1, 2, 3, 6])  # [num_rows + 1]
    args = (host, qsl, seq_lens, slots, num_drafts, prefill_len, last_sampled, draft_tokens)
    args += (cu_num_logits,)
    kernel_ids, kernel_logits = combine(*args, num_logits=6, backend="triton")
    twin_ids, twin_logits = combine(*args, num_logits=6, backend="torch")
    prefill_by_row = prefill_len[slots.long()]  # [num_rows]
    stale = stale_position_mask(qsl, seq_lens, prefill_by_row, num_drafts)  # [num_tokens] bool
    assert torch.equal(kernel_ids, twin_ids) and torch.equal(kernel_logits, twin_logits)
    assert torch.equal(kernel_ids != host, stale)


@pytest.mark.paid("SHI-11", before=async_branch_cuda_only)
def test_async_branch_reachable_on_cpu():
    from tokenstate.models.toy import toy_factory

    honoring = toy_factory("SpecHonoringToy", honors=True, embed="device")
    async_tokens, stats = generate(honoring, async_scheduling=True, device="cpu")
    sync_tokens, _ = generate(honoring, async_scheduling=False, device="cpu")
    assert async_tokens == sync_tokens
    assert stats.async_steps > 0 and stats.fallback_steps == 0 and stats.sync_steps == 0


REFERENCE_ARCHITECTURES = ("LlamaForCausalLM", "NemotronHForCausalLM", "KimiLinearForCausalLM")


@pytest.mark.paid("SHI-12", before=delegation_blind)
def test_checker_verdicts_through_delegation():
    from tokenstate.checker import Verdict
    from tokenstate.models.toy import toy_factory
    from tokenstate.runtime import registry
    from tokenstate.tools.routing_check import check_registry

    # Declares the opt-in but embeds host ids: the checker must see it although the flag says honors.
    liar = toy_factory("SpecCheckerLiar", honors=True, embed="host")
    registry.register(liar)
    try:
        reference = [registry.resolve(arch) for arch in REFERENCE_ARCHITECTURES]
        results = check_registry().by_entry()
    finally:
        registry.unregister(liar)
    for factory in reference:  # they delegate: shared dense block, published scope, deep embed
        assert results[factory.name].verdict is Verdict.HONORS, results[factory.name].routes
        assert results[factory.name].finding is None
    flagged = results[liar.name]
    assert flagged.verdict is Verdict.IGNORES and flagged.finding is not None
    assert any("toy.py:" in route.render() for route in flagged.routes)


@pytest.mark.paid("SHI-13", before=async_splices_wrong_token)
def test_token_gate_matches_the_oracle():
    from tokenstate.tools.gate import GateConfig, run_gate

    # Short requests, but still mixed: a chunked prefill, slot reuse, prefills beside decodes.
    config = GateConfig(num_requests=5, max_tokens=6, max_num_seqs=2, max_num_batched_tokens=16, quick=True)
    for model in ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear"):
        report = run_gate(model, config)
        assert report.comparisons == ["async vs sync", "sync vs oracle", "async vs oracle"]
        assert report.passed, (model, report.totals())


@pytest.mark.owed("SHI-14")
def test_async_path_on_cuda():
    from tokenstate.tools.gate import GateConfig, run_gate

    assert torch.cuda.is_available(), "no CUDA device: the CUDA async path has never run here"
    config = GateConfig(num_requests=5, max_tokens=6, max_num_seqs=2, max_num_batched_tokens=16, device="cuda")
    for model in ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear"):
        report = run_gate(model, config)
        assert report.passed and report.stats["async"]["async_steps"] > 0, (model, report.totals())
