"""The docs hooks' generators, on small inputs: spec pages with and without a ledger, benchmarks, API tree."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

from tokenstate.ledger import Ledger, parse_spec

SPEC = """# Example contract

Nothing stale is ever embedded.

## Owed

- **EX-2** A later promise. — `test_example.py::test_later`

## Paid

- **EX-1** A kept promise with `policy="refuse"` and a | pipe. — `test_example.py::test_kept`
"""


@pytest.fixture
def site_specs(hooks_on_path: None) -> ModuleType:
    return importlib.import_module("site_specs")


@pytest.fixture
def example_spec(tmp_path: Path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "test_example.py").write_text("def test_kept():\n    pass\n")
    path = tmp_path / "specs" / "example.md"
    path.write_text(SPEC)
    return parse_spec(path)


def test_without_a_ledger_every_item_shows_its_state_and_not_run_yet(
    site_specs: ModuleType, example_spec, tmp_path: Path
) -> None:
    source = site_specs.read_ledger(tmp_path / "missing.json")
    page = site_specs.render_spec_page(example_spec, source, tmp_path)
    assert "No test run recorded yet" in page
    for item_id, state in (("EX-1", "paid"), ("EX-2", "owed")):
        row = next(line for line in page.splitlines() if f'id="{item_id}"' in line)
        assert f'ts-{state}">{state}<' in row and "not run yet" in row


def test_ledger_results_are_shown_and_a_stale_entry_is_ignored(
    site_specs: ModuleType, example_spec, tmp_path: Path
) -> None:
    ledger = Ledger.build([example_spec], tmp_path, {}, {})
    ledger.items[1].last_result, ledger.items[1].red_before_verified = "passed", True  # EX-1, paid
    ledger.items[1].mutant, ledger.items[1].mutant_doc = "EX-1/bug-back", "reverts the fix"
    ledger.items[0].last_result, ledger.items[0].state = (
        "passed",
        "paid",
    )  # EX-2 moved since the run
    path = tmp_path / "ledger.json"
    ledger.write(path)
    page = site_specs.render_spec_page(example_spec, site_specs.read_ledger(path), tmp_path)
    rows = {
        i: next(line for line in page.splitlines() if f'id="{i}"' in line) for i in ("EX-1", "EX-2")
    }
    assert ">passed<" in rows["EX-1"] and ">yes<" in rows["EX-1"]
    assert "not run yet" in rows["EX-2"], "a result recorded for another state must not be shown"
    assert "`EX-1/bug-back`: reverts the fix" in page
    # The promise stays markdown (no double-escaped quotes) and cannot break the table row.
    assert "with <code>policy=&quot;refuse&quot;</code> and a &#124; pipe." in rows["EX-1"]


def test_unreadable_ledger_is_reported_on_the_page(
    site_specs: ModuleType, example_spec, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.json"
    path.write_text("{not json")
    page = site_specs.render_spec_page(example_spec, site_specs.read_ledger(path), tmp_path)
    assert "The ledger could not be read" in page and "not valid JSON" in page


def test_benchmarks_page_without_and_with_results(hooks_on_path: None, tmp_path: Path) -> None:
    bench = importlib.import_module("site_benchmarks")
    assert "python benchmarks/run_all.py" in bench.render_benchmarks_page(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    row = {
        "id": "P1",
        "benchmark": "contract_overhead",
        "measure": "boundary vs off",
        "ours": 1.5,
        "baseline": 1.49,
        "ratio": 1.0067,
        "unit": "us",
        "target": "<= 1.02",
        "pass": True,
    }
    results = {
        "generated": "2026-01-01 00:00:00 UTC",
        "machine": "x86_64",
        "quick": False,
        "rows": [row],
    }
    (tmp_path / "benchmarks" / "results.json").write_text(json.dumps(results))
    page = bench.render_benchmarks_page(tmp_path)
    assert (
        "| P1 | contract_overhead | boundary vs off | 1.5 | 1.49 | 1.007 | us | &lt;= 1.02 | PASS |"
        in page
    )
    assert "1 of 1 measures meet their target." in page
    (tmp_path / "benchmarks" / "results.json").write_text("[]")
    with pytest.raises(ValueError, match="re-run it"):
        bench.render_benchmarks_page(tmp_path)


def test_api_tree_mirrors_the_installed_layout(hooks_on_path: None) -> None:
    import shutil

    tree_module = importlib.import_module("site_api_tree")
    repo = Path(__file__).resolve().parents[2]
    tree = tree_module.build_api_tree(repo)
    try:
        top = tree / "tokenstate"
        assert (top / "__init__.py").resolve() == (
            repo / "src" / "tokenstate" / "__init__.py"
        ).resolve()
        for name in ("contracts", "runtime", "models", "tools", "checker", "ledger"):
            assert (top / name).resolve() == (repo / name).resolve()
    finally:
        shutil.rmtree(tree)
    assert not tree.exists()
