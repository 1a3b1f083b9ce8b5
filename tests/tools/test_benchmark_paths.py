"""The benchmark scripts still find the repository files they read.

Nothing else runs ``benchmarks/`` in the test tiers (they measure, for minutes), so a moved test
tree or data file would only show when somebody next runs ``run_all.py``. Every module-level
``Path`` constant of a benchmark module that points into the repository must exist.
"""

from __future__ import annotations

import importlib
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
