"""The LLM API over the toy model: async == sync, stops, discards, slot reuse and bad input."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from jaxtyping import Float
from torch import Tensor

from tokenstate.contracts import ConfigError, ForwardInput, entry_point
from tokenstate.models.toy import ToyLM, toy_factory, toy_forward
from tokenstate.runtime import LLM, SamplingParams, registry

# Mixed lengths; the longest (20) exceeds the token budget used below (8), so prefill is chunked.
PROMPTS = [
    list(range(1, 21)),
    [5, 6, 7],
    [9] * 13,
    [3, 4],
    [7, 7, 7, 7, 7],
    [100, 2, 50, 8, 8, 8, 1],
]
SAMPLING = [
    SamplingParams(max_tokens=10),
    SamplingParams(max_tokens=7, temperature=0.8, seed=3),
    SamplingParams(max_tokens=9, temperature=1.0, top_k=5),
    SamplingParams(max_tokens=6, temperature=0.7, top_p=0.8, seed=11),
    SamplingParams(max_tokens=8),
    SamplingParams(max_tokens=5, temperature=1.2, top_k=20, top_p=0.9),
]


def generate(factory, *, async_scheduling: bool, **kwargs):
    llm = LLM(
        factory,
        async_scheduling=async_scheduling,
        max_num_seqs=3,
        max_num_batched_tokens=8,
        **kwargs,
    )
    return llm, llm.generate(PROMPTS, SAMPLING)


@pytest.mark.parametrize("honors", [True, False], ids=["honors", "not-honors"])
def test_async_equals_sync_with_chunked_prefill_and_slot_reuse(honors):
    factory = toy_factory(honors=honors)
    async_llm, async_out = generate(factory, async_scheduling=True)
    sync_llm, sync_out = generate(factory, async_scheduling=False)
    assert [o.token_ids for o in async_out] == [o.token_ids for o in sync_out]
    assert [len(o.token_ids) for o in async_out] == [p.max_tokens for p in SAMPLING]
    assert all(o.finish_reason == "length" for o in async_out)
    assert all(0 <= t < 128 for o in async_out for t in o.token_ids)
    assert [o.prompt_token_ids for o in async_out] == [tuple(p) for p in PROMPTS]
    assert (
        sync_llm.stats.sync_steps > 0
        and sync_llm.stats.async_steps == sync_llm.stats.fallback_steps == 0
    )
    if honors:
        assert async_llm.stats.async_steps > 0 and async_llm.stats.fallback_steps == 0
    else:
        assert async_llm.stats.fallback_steps > 0 and async_llm.stats.sync_steps == 0
    assert async_llm.stats.finished_requests == len(PROMPTS)


def test_repeated_generate_calls_reuse_slots_cleanly():
    llm = LLM(toy_factory(), max_num_seqs=2, max_num_batched_tokens=8)
    first = llm.generate(PROMPTS, SAMPLING)
    second = llm.generate(PROMPTS, SAMPLING)
    assert [o.token_ids for o in first[:1]] == [o.token_ids for o in second[:1]]  # greedy
    assert [o.token_ids for o in first[1:2]] == [o.token_ids for o in second[1:2]]  # explicit seed


_SEEN: list[tuple[bool, bool]] = []


@entry_point
def spy_forward(model: ToyLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    """Records (has stale rows, got device tokens) per step, then runs the correct toy forward."""
    _SEEN.append((inp.has_stale_rows, inp.device_tokens is not None))
    return toy_forward.__wrapped__(model, inp)


@pytest.mark.parametrize("honors", [True, False])
def test_only_an_opted_in_forward_is_handed_device_tokens(honors):
    _SEEN.clear()
    factory = dataclasses.replace(
        toy_factory(), forward=spy_forward, honors_device_token_ids=honors
    )
    generate(factory, async_scheduling=True)
    if honors:
        assert (True, True) in _SEEN and all(got for _, got in _SEEN)
    else:
        assert _SEEN and not any(stale or got for stale, got in _SEEN)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_eos_stops_and_the_async_extra_token_is_discarded(async_scheduling):
    probe = LLM(toy_factory(), async_scheduling=False).generate(
        [PROMPTS[0]], SamplingParams(max_tokens=10)
    )
    eos = probe[0].token_ids[3]
    cut = probe[0].token_ids.index(eos) + 1
    llm = LLM(toy_factory(eos_token_id=eos), async_scheduling=async_scheduling, max_num_seqs=2)
    out = llm.generate([PROMPTS[0], PROMPTS[1]], SamplingParams(max_tokens=10))
    assert out[0].token_ids == probe[0].token_ids[:cut] and out[0].finish_reason == "stop"
    ignored = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=10, ignore_eos=True))
    assert ignored[0].token_ids == probe[0].token_ids and ignored[0].finish_reason == "length"
    if async_scheduling:
        assert llm.stats.discarded_tokens >= 1  # EOS was learnt after the next step launched
    else:
        assert llm.stats.discarded_tokens == 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_stop_token_ids_max_tokens_and_context_length(async_scheduling):
    factory = toy_factory(max_model_len=24)
    llm = LLM(factory, async_scheduling=async_scheduling)
    free = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=12))[0].token_ids
    stop = free[4]
    out = llm.generate(
        [PROMPTS[1], PROMPTS[1], PROMPTS[0]],
        [
            SamplingParams(max_tokens=12, stop_token_ids=(stop,)),
            SamplingParams(max_tokens=2),
            SamplingParams(max_tokens=50),
        ],
    )
    assert out[0].token_ids == free[: free.index(stop) + 1] and out[0].finish_reason == "stop"
    assert out[1].token_ids == free[:2] and out[1].finish_reason == "length"
    assert (
        len(out[2].token_ids) == 24 - 20 and out[2].finish_reason == "length"
    )  # the context is full


def test_model_by_architecture_preset_and_path(tmp_path):
    factory = toy_factory("ToyNamedLM", seed=5)
    registry.register(factory)
    try:
        expected = LLM(factory).generate(PROMPTS[:2], SamplingParams(max_tokens=6))
        by_arch = LLM("ToyNamedLM").generate(PROMPTS[:2], SamplingParams(max_tokens=6))
        by_preset = LLM("toynamedlm").generate(PROMPTS[:2], SamplingParams(max_tokens=6))
        factory.save(factory.build_preset("toynamedlm"), tmp_path / "toy")
        by_path = LLM(tmp_path / "toy").generate(PROMPTS[:2], SamplingParams(max_tokens=6))
    finally:
        registry.unregister(factory)
    assert expected == by_arch == by_preset == by_path


@pytest.mark.parametrize(
    ("prompts", "sampling", "message"),
    [
        ([[1, 2], []], None, "prompt 1 is empty"),
        (
            [[1, 128, -1]],
            None,
            r"prompt 0: token ids \[128, -1\] are outside the vocabulary \[0, 128\)",
        ),
        (
            [list(range(100)) * 2],
            None,
            "prompt 0 has 200 tokens but model 'ToyLM' has a context of max_model_len=128",
        ),
        (["hello"], None, "prompt 0: expected a list of token ids, got str"),
        ([[1]], [SamplingParams(), SamplingParams()], "a list of 1 \\(one per prompt\\)"),
        (
            [[1]],
            SamplingParams(stop_token_ids=(500,)),
            r"stop_token_ids \[500\] are outside the vocabulary",
        ),
        ([[1]], {"max_tokens": 3}, "sampling_params must be one SamplingParams"),
        ([np.array([1.0, 2.0])], None, r"prompt 0: token ids must be integers, got ndarray dtype float64"),
        ([torch.tensor([[1, 2]])], None, r"prompt 0: a Tensor prompt must be 1-D .* got shape \(1, 2\)"),
        ([np.array([1, 128])], None, r"prompt 0: token ids \[128\] are outside the vocabulary"),
        (torch.tensor([[1, 2], [3, 0]]), None, "a 2-D Tensor of prompts cannot say where each one's padding is"),
        (np.array([1, 2, 3]), None, r"prompts is one 1-D ndarray, the ids of one prompt; pass a list of prompts, e.g. \[ids\]"),
    ],
)
def test_bad_generate_input_is_refused_before_any_step(prompts, sampling, message):
    llm = LLM(toy_factory())
    with pytest.raises(ConfigError, match=message):
        llm.generate(prompts, sampling)
    assert llm.stats.total_steps == 0
    assert llm.generate([[1, 2]], SamplingParams(max_tokens=2))[0].finish_reason == "length"


def test_a_prompt_may_be_a_1d_integer_array_or_tensor_as_a_tokenizer_returns_it():
    """One prompt's ids as numpy or torch return them (``tokenizer(text, return_tensors="np")``
    rows, ``input_ids[0]``) are taken as its list of ids, on the CPU or any device."""
    llm = LLM(toy_factory())
    params = SamplingParams(max_tokens=4)
    expected = [o.token_ids for o in llm.generate([[5, 6, 7], [9, 3]], params)]
    given = [np.array([5, 6, 7], dtype=np.int32), torch.tensor([9, 3])]
    assert [o.token_ids for o in llm.generate(given, params)] == expected
    assert llm.generate([np.array([9, 3], dtype=np.uint16)], params)[0].token_ids == expected[1]
    llm.add_request(torch.tensor([5, 6, 7], dtype=torch.int16), params)
    done = []
    while llm.has_unfinished_requests():
        done += llm.step()
    assert [o.token_ids for o in done] == [expected[0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, r"max_tokens must be an int >= 1, got 0"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"seed": -3}, "seed must be an int >= 0"),
        ({"stop_token_ids": 7}, "stop_token_ids must be a sequence of token ids"),
        ({"ignore_eos": 1}, "ignore_eos must be a bool"),
        # vLLM's (and OpenAI's) range: beyond it a penalty overflows float32 logits into NaN
        ({"presence_penalty": 1e39}, r"presence_penalty must lie in \[-2, 2\], got 1e\+39"),
        ({"frequency_penalty": -2.5}, r"frequency_penalty must lie in \[-2, 2\], got -2.5"),
        # the device holds top_k as int32, and top_p / the repetition penalty as float32 logits
        ({"top_k": 2**31}, r"top_k must be at most 2147483647"),
        ({"top_k": 2**63}, r"top_k must be at most 2147483647"),
        ({"top_p": 1e-46}, r"top_p=1e-46 is 0 in float32"),
        ({"repetition_penalty": 1e-39}, r"repetition_penalty must lie in \[0.01, 100\]"),
        ({"repetition_penalty": 1e39}, r"repetition_penalty must lie in \[0.01, 100\]"),
        ({"temperature": np.float32("nan")}, "temperature must be a finite number >= 0"),
    ],
)
def test_invalid_sampling_params(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)


def test_vllm_defaults_and_iterables_for_the_id_lists():
    """vLLM's own defaults (``stop_token_ids=None``, ``bad_words=None``) mean "none"; a generator
    or numpy ids are read once, whole, never emptied by the validation."""
    assert SamplingParams(stop_token_ids=None, bad_words=None) == SamplingParams()
    assert SamplingParams(stop_token_ids=(i for i in [5, 6])).stop_token_ids == (5, 6)
    assert SamplingParams(stop_token_ids=np.array([5, 6])).stop_token_ids == (5, 6)
    assert SamplingParams(bad_words=[np.array([3, 4])]).bad_words == ((3, 4),)
    with pytest.raises(ConfigError, match="stop_token_ids must be a sequence of token ids"):
        SamplingParams(stop_token_ids=[5, True])


def test_bad_words_that_ban_every_token_are_refused():
    """Bad words whose last tokens cover the whole vocabulary could leave a step nothing to sample:
    refused when the request is added, naming the fix, never a banned token generated."""
    llm = LLM(toy_factory())
    vocab = llm.model.vocab_size
    everything = SamplingParams(max_tokens=2, bad_words=[[t] for t in range(vocab)])
    with pytest.raises(ConfigError, match=f"bad_words ban every one of the model's {vocab} tokens"):
        llm.generate([[5, 6]], everything)
    # every token but 0 always, and 0 right after a 6 (the prompt's last token): nothing is left
    after_six = SamplingParams(max_tokens=2, bad_words=[[t] for t in range(1, vocab)] + [[6, 0]])
    with pytest.raises(ConfigError, match="leave at least one token that no word ends with"):
        llm.generate([[5, 6]], after_six)
    most = SamplingParams(max_tokens=2, bad_words=[[t] for t in range(1, vocab)])
    assert llm.generate([[5, 6]], most)[0].token_ids == (0, 0)


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        ("NoSuchLM", {}, "unknown architecture or model 'NoSuchLM'"),
        (None, {}, "model must be a registered name, a ModelFactory or a path, got NoneType"),
        (
            toy_factory(),
            {"on_unhonored": "ignore"},
            "on_unhonored='ignore' is not a policy; valid: fallback, refuse",
        ),
        (toy_factory(), {"max_num_seqs": 0}, "max_num_seqs must be a positive int, got 0"),
        (
            toy_factory(),
            {"max_num_batched_tokens": 2.5},
            "max_num_batched_tokens must be a positive int",
        ),
        (toy_factory(), {"async_scheduling": "yes"}, "async_scheduling must be a bool"),
        (toy_factory(), {"compile": "yes"}, "compile must be a bool"),
        (toy_factory(), {"device": "tpu:0"}, "device='tpu:0'"),
        (toy_factory(), {"seed": -1}, "seed must be an int >= 0"),
    ],
)
def test_bad_engine_settings(model, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LLM(model, **kwargs)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ConfigError, match="CUDA is not available here; use device='cpu'"):
        LLM(toy_factory(), device="cuda")


def test_a_cpu_device_index_is_refused_not_ignored():
    """torch runs every CPU tensor on the same device: an index would be silently meaningless."""
    assert LLM(toy_factory(), device="cpu:0").generate([[1, 2]], SamplingParams(max_tokens=1))
    with pytest.raises(ConfigError, match=r"device='cpu:5': a CPU has no device index; use device='cpu'"):
        LLM(toy_factory(), device="cpu:5")


@pytest.mark.parametrize(
    ("async_scheduling", "honors"), [(True, True), (True, False), (False, True)]
)
def test_each_token_records_the_step_and_row_that_sampled_it(async_scheduling, honors):
    llm = LLM(toy_factory(honors=honors), async_scheduling=async_scheduling, max_num_seqs=2)
    out = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=4))
    for o in out:
        assert len(o.origins) == len(o.token_ids)
        steps = [origin.step for origin in o.origins]
        assert steps == sorted(steps) and steps[-1] < llm.stats.total_steps
        # The prefill's token comes from fresh ids; decode rows are spliced only on the async
        # path of a forward that honours device ids (a fallback step runs on fresh host ids).
        assert [origin.stale for origin in o.origins] == [False] + [async_scheduling and honors] * 3
    assert out[0].origins[0].row == 0 and out[1].origins[0].row == 1
    stats = llm.stats.as_dict()
    assert stats["total_steps"] == llm.stats.total_steps == 4 and stats["finished_requests"] == 2


@pytest.mark.parametrize("cpu_stream", ["inline", "thread", "process"])
def test_close_stops_the_stream_and_refuses_further_work(cpu_stream):
    """``close()`` (or leaving a ``with`` block) stops the engine's stream at once — the worker
    thread or the forked device process — rather than whenever the garbage collector gets to it,
    and the closed engine refuses new work with a clear error."""
    import os
    import threading

    from tokenstate.runtime.process_stream import process_stream_available

    if cpu_stream == "process" and not process_stream_available():
        pytest.skip("the device process needs Linux")
    workers_before = {t for t in threading.enumerate() if t.name == "tokenstate-cpu-stream"}
    with LLM(toy_factory(), async_scheduling=True, max_num_seqs=2, cpu_stream=cpu_stream) as llm:
        out = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert [len(o.token_ids) for o in out] == [4, 4]
        stream = llm._engine.runner.stream
        pid = stream._link.pid if cpu_stream == "process" else None
        llm.add_request([7, 8], SamplingParams(max_tokens=4))
        llm.step()  # left unfinished: close() drops it
    if pid is not None:
        assert stream._link.pid is None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: the device process is gone
    workers_after = {t for t in threading.enumerate() if t.name == "tokenstate-cpu-stream"}
    assert not any(t.is_alive() for t in workers_after - workers_before)
    assert not llm.has_unfinished_requests()
    for call in (
        lambda: llm.generate([[1, 2]]),
        lambda: llm.add_request([1, 2]),
        llm.step,
    ):
        with pytest.raises(ConfigError, match="closed"):
            call()
    llm.close()  # idempotent


def test_an_llm_inherited_by_a_forked_process_is_refused_there():
    """On every CPU stream, inline included: a forked child's copy of torch's intra-op thread pool
    can hang its first forward, so the child is told to create its own LLM, while the parent's
    LLM keeps serving."""
    llm = LLM(toy_factory(), max_num_seqs=2)
    params = SamplingParams(max_tokens=3)
    expected = llm.generate([[5, 6]], params)[0].token_ids
    pid = os.fork()
    if pid == 0:  # the child: report through its exit status, never return into pytest
        code = 1
        try:
            try:
                llm.generate([[5, 6]], params)
                code = 2
            except ConfigError as refused:
                code = 0 if "forked" in str(refused) and "Create the LLM in the process that uses it" in str(refused) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert llm.generate([[5, 6]], params)[0].token_ids == expected


def test_a_temperature_below_float32_range_samples_the_greedy_tokens():
    """Sampling at a vanishing temperature is greedy in the limit; it must never turn the logits
    into NaN (1e-40 is a float32 subnormal: dividing by it overflows every logit to inf)."""
    llm = LLM(toy_factory(), async_scheduling=False)
    prompts = [[5, 6, 7], [9, 3]]
    greedy = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))]
    for temperature in (1e-40, 1e-30):
        cold = SamplingParams(max_tokens=8, ignore_eos=True, temperature=temperature, seed=3)
        assert [o.token_ids for o in llm.generate(prompts, cold)] == greedy, temperature


def test_numpy_floats_are_numbers_in_sampling_params():
    params = SamplingParams(temperature=np.float32(0.7), top_p=np.float32(0.9), repetition_penalty=np.float16(1.5))
    assert (params.temperature, params.top_p) == (np.float32(0.7), np.float32(0.9))
    with pytest.raises(ConfigError, match="repetition_penalty must be a finite number > 0"):
        SamplingParams(repetition_penalty=np.bool_(True))


def test_numpy_integers_are_ints_in_sampling_params_and_a_meta_tensor_prompt_is_refused():
    params = SamplingParams(max_tokens=np.int64(3), top_k=np.int32(2), seed=np.uint8(7))
    assert (params.max_tokens, params.top_k, params.seed) == (3, 2, 7)
    assert all(type(v) is int for v in (params.max_tokens, params.top_k, params.seed))
    with pytest.raises(ConfigError, match="max_tokens must be an int >= 1"):
        SamplingParams(max_tokens=np.bool_(True))
    with pytest.raises(ConfigError, match=r"prompt 0: a meta-device tensor holds no ids"):
        LLM(toy_factory()).generate([torch.zeros(3, dtype=torch.long, device="meta")])
    with pytest.raises(ConfigError, match=r"prompt 0: a sparse tensor \(torch.sparse_coo\); pass ids.to_dense\(\)"):
        LLM(toy_factory()).generate([torch.tensor([1, 0, 2]).to_sparse()])
