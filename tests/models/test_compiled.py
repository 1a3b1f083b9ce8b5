"""``LLM(compile=True)``: the dense decoder stack as one inductor graph, projections and attention opaque."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from tokenstate.contracts import ConfigError
from tokenstate.models.compiled import OpaqueSites
from tokenstate.models.cpu_gemm import cpu_gemm_mode
from tokenstate.models.fused_linear import onednn_packing_available
from tokenstate.models.llama import FACTORY, PRESETS, build
from tokenstate.runtime import LLM, SamplingParams

# Prompts of 1..9 tokens, 4 slots and a 6-token budget: chunked prefills, mixed steps, steps of
# one token (eager) and of several (compiled), and slot reuse.
PROMPTS = [[3 + (7 * i + j) % 90 for j in range(1 + i % 9)] for i in range(7)]


@pytest.mark.parametrize("cpu_stream", ["inline", "thread"])
def test_compiled_engine_generates_the_eager_tokens_and_compiles_once(cpu_stream: str) -> None:
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 6, "cpu_stream": cpu_stream}
    eager = [o.token_ids for o in LLM("tiny-llama", **options).generate(PROMPTS, params)]
    torch._dynamo.reset()  # forget graphs an earlier test compiled for this shape
    graphs = counters["stats"]["unique_graphs"]
    compiled = LLM("tiny-llama", compile=True, **options)
    assert [o.token_ids for o in compiled.generate(PROMPTS, params)] == eager
    assert [o.token_ids for o in compiled.generate(PROMPTS[::-1], params)] == [
        o.token_ids for o in LLM("tiny-llama", **options).generate(PROMPTS[::-1], params)
    ]
    assert counters["stats"]["unique_graphs"] - graphs == 1  # every step count and slot layout


def test_the_device_process_compiles_and_runs_the_compiled_stack(tmp_path, monkeypatch) -> None:
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 6}
    eager = [o.token_ids for o in LLM("tiny-llama", **options).generate(PROMPTS, params)]
    torch._dynamo.reset()  # the fork inherits the host's graphs: let the device process make its own
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # read at compile time, forked with it
    graphs = counters["stats"]["unique_graphs"]
    compiled = LLM("tiny-llama", compile=True, cpu_stream="process", **options)
    assert [o.token_ids for o in compiled.generate(PROMPTS, params)] == eager
    assert counters["stats"]["unique_graphs"] == graphs  # the host never ran the model
    assert any(tmp_path.rglob("*.py")), "the device process compiled nothing"


def test_compile_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(ConfigError, match="no compiled path"):
        LLM("tiny-nemotron-h", compile=True)
    with pytest.raises(ConfigError, match="runs eagerly unless compile=True"):
        LLM("tiny-llama", enforce_eager=True)


def test_a_copy_of_a_compiled_model_runs_eagerly_on_its_own_weights(make_input) -> None:
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(2)
    model.compile_layers()
    twin = copy.deepcopy(model)
    assert twin.model._compiled_layers is None and twin.model._projections == []
    assert all(layer.self_attn._op is None for layer in twin.model.layers)
    with torch.no_grad():
        twin.model.layers[0].mlp.down_proj.weight.mul_(3)  # the copy's weights only
    eager = FACTORY.build_preset("tiny-llama")
    eager.allocate_slots(2)
    with torch.no_grad():
        eager.model.layers[0].mlp.down_proj.weight.mul_(3)
    inp = make_input([(1, [5, 6, 7, 8])], vocab_size=512, all_logits=True)
    torch.testing.assert_close(FACTORY.forward(twin, inp), FACTORY.forward(eager, inp), rtol=0, atol=0)


def test_grad_mode_runs_a_compiled_model_eagerly_so_gradients_reach_the_weights(make_input) -> None:
    model = FACTORY.build_preset("tiny-llama")
    model.allocate_slots(2)
    model.compile_layers()
    weight = model.model.layers[0].self_attn.q_proj.weight.requires_grad_(True)
    graphs = counters["stats"]["unique_graphs"]
    with torch.enable_grad():
        hidden = model.model(make_input([(0, [5, 6, 7, 8])], vocab_size=512))  # [1, hidden]
        hidden.sum().backward()
    assert counters["stats"]["unique_graphs"] == graphs  # nothing was compiled
    assert weight.grad is not None and bool(weight.grad.abs().sum() > 0)


def test_models_of_one_shape_share_one_graph_and_each_computes_with_its_own_weights(make_input) -> None:
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    inp = make_input([(0, [5, 6, 7]), (1, [8, 9])], vocab_size=512)
    for scale in (1.0, -2.0, 0.5, 3.0, 1.5, -1.0, 2.5, 0.25, 4.0, -0.5):  # more than dynamo's 8 recompiles
        compiled, eager = FACTORY.build_preset("tiny-llama"), FACTORY.build_preset("tiny-llama")
        for model in (compiled, eager):
            with torch.no_grad():
                model.model.layers[1].mlp.up_proj.weight.mul_(scale)
            model.allocate_slots(2)
        compiled.compile_layers()
        with torch.inference_mode():
            torch.testing.assert_close(FACTORY.forward(compiled, inp), FACTORY.forward(eager, inp), rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] - graphs == 1


def test_layers_dynamo_runs_eagerly_instead_still_read_the_step(make_input) -> None:
    compiled, eager = FACTORY.build_preset("tiny-llama"), FACTORY.build_preset("tiny-llama")
    for model in (compiled, eager):
        model.allocate_slots(2)
    compiled.compile_layers()
    inp = make_input([(0, [5, 6, 7]), (1, [8, 9])], vocab_size=512)
    with torch.inference_mode(), torch.compiler.set_stance("force_eager"):  # as after a recompile limit
        torch.testing.assert_close(FACTORY.forward(compiled, inp), FACTORY.forward(eager, inp), rtol=0, atol=0)


# Every projection of this shape is 2^18 elements and more: packed where oneDNN is pinned.
PACKED_SHAPE = {"vocab_size": 512, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
                "num_key_value_heads": 4, "num_hidden_layers": 2, "max_position_embeddings": 64}  # fmt: skip


@pytest.mark.skipif(not onednn_packing_available(), reason="no oneDNN pre-packed linear ops in this torch")
def test_a_packed_layer_is_two_opaque_calls_and_computes_with_the_current_weights(make_input, monkeypatch) -> None:
    with cpu_gemm_mode("onednn"):
        compiled, eager = (build({**PRESETS["tiny-llama"], **PACKED_SHAPE}, seed=5) for _ in range(2))
    layer = compiled.model.layers[0]
    assert all(projection.packed for projection, _ in layer.projections())
    for model in (compiled, eager):
        model.allocate_slots(3)
    compiled.compile_layers()
    calls = []
    original_call = OpaqueSites.call
    monkeypatch.setattr(OpaqueSites, "call", lambda sites, i, inputs: calls.append(i) or original_call(sites, i, inputs))
    prompts = [(0, [5, 6, 7]), (2, [8, 9, 10, 11])]
    with torch.inference_mode():
        for step in range(3):  # prefill, then decode steps of two tokens (compiled: 2+ tokens)
            inp = make_input(prompts, vocab_size=512)
            torch.testing.assert_close(FACTORY.forward(compiled, inp), FACTORY.forward(eager, inp), rtol=1e-4, atol=1e-4)
            prompts = [(slot, [3 + step], len(tokens) + step) for slot, tokens in [(0, [5, 6, 7]), (2, [8, 9, 10, 11])]]
            if step == 0:
                # One opaque call per block, the attention block and the MLP, where there were five
                # (four projections and the attention) before the blocks were merged.
                assert len(calls) == 2 * len(compiled.model.layers), calls
                for model in (compiled, eager):  # a weight written in place after compilation
                    model.model.layers[1].mlp.down_proj.weight.mul_(-1.5)
                    model.model.layers[0].self_attn.q_proj.weight.mul_(0.5)
