"""The benchmark scripts still find the repository files they read.

Nothing else runs ``benchmarks/`` in the test tiers (they measure, for minutes), so a moved test
tree or data file would only show when somebody next runs ``run_all.py``. Every module-level
``Path`` constant of a benchmark module that points into the repository must exist.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
MODULES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))


@pytest.fixture(scope="module", autouse=True)
def benchmarks_on_path() -> Iterator[None]:
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_module_paths_exist(name: str) -> None:
    module = importlib.import_module(name)
    paths = {
        attr: value
        for attr, value in vars(module).items()
        if isinstance(value, Path) and value.resolve().is_relative_to(REPO)
    }
    missing = {attr: str(p) for attr, p in paths.items() if not p.exists()}
    assert not missing, f"benchmarks/{name}.py reads paths that are gone: {missing}"


def test_the_peer_benchmark_reports_every_row_it_makes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every row of a peer cell (the eager row included) carries the fields its summary line prints.

    The engines are faked (a real cell runs for minutes): each returns fixed tokens and speeds.
    """
    peers = importlib.import_module("engine_vs_peers")

    def fake_spawn(engine: str, spec: dict, workdir: Path, python: str | None = None) -> dict:
        tokens = [[7] * n for n in spec["max_tokens"]]
        return {"tokens_per_s": [100.0] * spec["reps"], "tokens": tokens, "peak_rss_mb": 1.0}

    monkeypatch.setattr(peers, "spawn", fake_spawn)
    rows = peers._cell("tiny", "A", tmp_path, "vllm-python", True, tmp_path)
    assert [r["measure"].split(",")[1].strip() for r in rows] == [
        "ours / vLLM-CPU", "ours eager (compile=False) / vLLM-CPU", "ours / HF generate (batched)",
    ]  # fmt: skip
    lines = peers.detail_lines(rows)
    assert len(lines) == 3 and all("tokens equal to HF 1024/1024" in line for line in lines)


def test_the_inline_async_row_drives_both_engines_in_alternating_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inline-stream row interleaves the two engines ``STEP_BLOCK`` steps at a time, so the
    machine's drift lands on both; whole back-to-back calls let it land on one."""
    avs = importlib.import_module("async_vs_sync")
    from tokenstate.runtime import LLM

    calls: list[int] = []
    step = LLM.step

    def logged(self: LLM) -> list:
        calls.append(id(self))
        return step(self)

    monkeypatch.setattr(LLM, "step", logged)
    monkeypatch.setattr(avs, "STEP_BLOCK", 2)
    result = avs._compare_steps("tiny-llama", num_prompts=4, max_tokens=6, reps=1)
    assert result["tokens_match"] and len(result["ratios"]) == 1
    runs = [len(list(group)) for _, group in itertools.groupby(calls)]
    # Each turn is one engine's block; the order swaps every turn, so the same engine may take two
    # blocks back to back (one run of up to 4) where the turns meet; a run only ends short when
    # that engine has finished.
    assert len(runs) > 4 and max(runs) <= 4, runs
