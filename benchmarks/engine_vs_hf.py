"""P2: generated tokens/s of our engine vs HF transformers ``generate``, same weights, CPU.

Run: ``python benchmarks/engine_vs_hf.py [--quick] [--presets NAME ...]``. For each reference preset
the weights are built once, written with the factory's ``save`` (HF format: ``config.json`` +
safetensors) and loaded from that directory by both sides: our ``LLM(path)`` and
``transformers.AutoModelForCausalLM.from_pretrained(path, dtype=float32)``. The workload is 16
requests with prompts of 8..63 tokens, greedy, 64 new tokens each, EOS ignored.

* ours: ``LLM(path, async_scheduling=True, max_num_seqs=16)`` serving all 16 requests;
* baseline: ``model.generate`` over the 16 prompts as one left-padded batch (the fair baseline:
  HF's own batching), and, reported only, one ``generate`` call per prompt.

Each engine runs in a fresh child process (so the peak RSS, ``getrusage`` ``ru_maxrss`` of the
child, is that engine's alone; ours never imports transformers), with a warm-up ``generate`` and
several timed repetitions; the children alternate (ours, HF, ours, HF, ...) so drifts of the shared
machine hit both. Reported: median tokens/s (min–max), the ratio, peak RSS of each, and how many
of our tokens equal HF's batched ones.

Runs with one intra-op thread on both sides: the models are tiny, and on a shared 2-core machine a
parallel op's barrier waits on descheduled threads, which would measure the scheduler, not the
engines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _measure import print_table, row  # noqa: E402

PRESETS = ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear")
NUM_REQUESTS = 16
NEW_TOKENS = 64
TARGET_RATIO = 3.0
_RESULT_TAG = "ENGINE_VS_HF_RESULT "


def workload(path: str) -> list[list[int]]:
    """16 prompts of mixed lengths (8..63 tokens), ids in [3, min(vocab, 503)) (clear of bos/eos/pad)."""
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    span = min(vocab, 503) - 3
    lengths = [8 + (17 * i) % 56 for i in range(NUM_REQUESTS)]
    return [[(31 * i + 7 * j) % span + 3 for j in range(n)] for i, n in enumerate(lengths)]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _child_ours(path: str, reps: int) -> dict[str, Any]:
    from tokenstate.runtime import LLM, SamplingParams

    prompts = workload(path)
    llm = LLM(path, async_scheduling=True, max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=1024)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params)  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        samples.append(NUM_REQUESTS * NEW_TOKENS / (time.perf_counter() - start))
    return {"tokens_per_s": samples, "tokens": [o.token_ids for o in outputs]}


def _child_hf(path: str, reps: int, serial_reps: int) -> dict[str, Any]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = workload(path)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # [16, width], pad id 0 on the left
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # [16, width]
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    config = transformers.GenerationConfig(
        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip

    def batched() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    def serial() -> None:
        with torch.no_grad():
            for prompt in prompts:
                model.generate(input_ids=torch.tensor([prompt]), generation_config=config)

    out = batched()  # warm-up
    samples, serial_samples = [], []
    for _ in range(reps):
        start = time.perf_counter()
        out = batched()
        samples.append(NUM_REQUESTS * NEW_TOKENS / (time.perf_counter() - start))
    for _ in range(serial_reps):
        start = time.perf_counter()
        serial()
        serial_samples.append(NUM_REQUESTS * NEW_TOKENS / (time.perf_counter() - start))
    return {
        "tokens_per_s": samples,
        "serial_tokens_per_s": serial_samples,
        "tokens": out[:, width:].tolist(),
    }


def child_main(engine: str, path: str, reps: int, serial_reps: int) -> None:
    import torch

    torch.set_num_threads(1)
    if engine == "ours":
        result = _child_ours(path, reps)
    else:
        result = _child_hf(path, reps, serial_reps)
    result["peak_rss_mb"] = _peak_rss_mb()
    print(_RESULT_TAG + json.dumps(result))


def _spawn(engine: str, path: Path, reps: int, serial_reps: int) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--path", str(path),
           "--reps", str(reps), "--serial-reps", str(serial_reps)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"engine_vs_hf child {engine} on {path} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(_RESULT_TAG) :])


def _save_preset(preset: str, root: Path) -> Path:
    import tokenstate.models  # noqa: F401  (registers the reference models)
    from tokenstate.runtime import registry

    factory = registry.resolve(preset)
    if factory.save is None:
        raise RuntimeError(f"factory {factory.name!r} cannot save weights; P2 needs an HF-format copy.")
    path = root / preset
    factory.save(factory.build_preset(preset), path)
    return path


def _compare(preset: str, root: Path, quick: bool) -> list[dict[str, Any]]:
    path = _save_preset(preset, root)
    rounds, reps = (1, 2) if quick else (3, 3)
    ours: list[dict[str, Any]] = []
    hf: list[dict[str, Any]] = []
    for r in range(rounds):  # alternate the engines' processes; serial HF only once (slow)
        ours.append(_spawn("ours", path, reps, 0))
        hf.append(_spawn("hf", path, reps, 1 if r == 0 else 0))
    ours_tps = [s for res in ours for s in res["tokens_per_s"]]
    hf_tps = [s for res in hf for s in res["tokens_per_s"]]
    serial_tps = [s for res in hf for s in res["serial_tokens_per_s"]]
    ours_med, hf_med = statistics.median(ours_tps), statistics.median(hf_tps)
    rss_ours = max(res["peak_rss_mb"] for res in ours)
    rss_hf = max(res["peak_rss_mb"] for res in hf)
    ours_tokens, hf_tokens = ours[-1]["tokens"], hf[-1]["tokens"]
    same = sum(a == b for o, h in zip(ours_tokens, hf_tokens, strict=True) for a, b in zip(o, h, strict=True))
    spread = {
        "ours_min_max": (round(min(ours_tps)), round(max(ours_tps))),
        "hf_min_max": (round(min(hf_tps)), round(max(hf_tps))),
    }
    rows = [
        row(
            f"generated tokens/s, ours / HF generate (batched, left-padded), {preset}",
            ours_med,
            hf_med,
            unit="tokens/s",
            target=f">= {TARGET_RATIO:g}",
            ok=ours_med / hf_med >= TARGET_RATIO,
            tokens_equal_to_hf=f"{same}/{NUM_REQUESTS * NEW_TOKENS}",
            peak_rss_mb=(round(rss_ours), round(rss_hf)),
            **spread,
        ),
        row(
            f"peak RSS of the P2 run, ours / HF, {preset}",
            rss_ours,
            rss_hf,
            unit="MiB (whole process)",
            target="report",
            ok=True,
        ),
    ]
    if serial_tps:
        rows.append(
            row(
                f"generated tokens/s, ours / HF generate one prompt at a time, {preset}",
                ours_med,
                statistics.median(serial_tps),
                unit="tokens/s",
                target="report",
                ok=True,
            )
        )
    return rows


def run(quick: bool = False, presets: tuple[str, ...] = PRESETS) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine_vs_hf_") as tmp:
        for preset in presets:
            rows += _compare(preset, Path(tmp), quick)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), help="presets to compare")
    parser.add_argument("--child", choices=("ours", "hf"), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--serial-reps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.path, args.reps, args.serial_reps)
        return
    results = run(args.quick, tuple(args.presets))
    print_table(results)
    for r in results:
        if "peak_rss_mb" in r:
            print(f"  {r['measure']}: tokens equal to HF {r['tokens_equal_to_hf']}; peak RSS MiB "
                  f"(ours, HF) {r['peak_rss_mb']}; tokens/s min–max ours {r['ours_min_max']}, HF {r['hf_min_max']}")


if __name__ == "__main__":
    main()
