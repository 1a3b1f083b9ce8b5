"""Items of specs/adoption.md: what a new user relies on, each provoked on purpose."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from tokenstate.contracts import set_checks_mode
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import LLM, SamplingParams, registry
from tokenstate.testing import assert_async_equals_sync
from tokenstate.tools.cli import main

from .adoption_mutants import (
    checks_mode_read_late,
    cwd_not_importable,
    divergence_not_a_failure,
    engine_unlocked,
    ledger_in_cwd_only,
    verify_runs_pytest_specs,
)

BROKEN_PLUGIN = Path(__file__).resolve().parents[2] / "tests" / "tools" / "plugins" / "broken_lm_plugin.py"


@pytest.mark.paid("ADO-1", before=engine_unlocked)
def test_one_engine_serves_several_threads():
    llm = LLM(toy_factory(), async_scheduling=True, max_num_seqs=2, max_num_batched_tokens=8)
    prompts = [[i + 1, 2, 3, 4, 5, 6, 7] for i in range(5)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = LLM(toy_factory(), async_scheduling=True, max_num_seqs=2, max_num_batched_tokens=8).generate(prompts, params)
    results, errors = [], []
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        try:
            for _ in range(3):
                results.append(llm.generate(prompts, params))
        except Exception as exc:  # collected: the assertion names it
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 12
    assert all(r == alone for r in results)
    assert alone == LLM(toy_factory(), async_scheduling=False).generate(prompts, params)  # and == sync


@pytest.mark.paid("ADO-2", before=checks_mode_read_late)
def test_a_bad_checks_mode_is_refused_before_any_command_runs(monkeypatch, capsys):
    monkeypatch.setenv("TOKENSTATE_CHECKS", "bogus")
    for argv in (["check"], ["gate", "--model", "tiny-llama", "--requests", "1", "--max-tokens", "2", "--no-oracle"]):
        set_checks_mode(None)
        assert main(argv) == 2, argv
        assert "TOKENSTATE_CHECKS='bogus' is not a checks mode; valid values: off, boundary, full" in capsys.readouterr().err


@pytest.mark.paid("ADO-3", before=cwd_not_importable)
def test_module_is_importable_from_the_current_directory(tmp_path, monkeypatch, capsys):
    package = tmp_path / "ado3_engine"
    package.mkdir(exist_ok=True)  # the ledger re-runs a paid test on the same tmp_path
    (package / "__init__.py").write_text(BROKEN_PLUGIN.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), ".")])
    try:
        assert main(["check", "--module", "ado3_engine"]) == 1  # imported; its forward ignores device ids
        assert "BrokenLM: ignores" in capsys.readouterr().out
    finally:
        module = sys.modules.pop("ado3_engine", None)
        if module is not None:
            registry.unregister(module.BROKEN)


@pytest.mark.paid("ADO-4", before=divergence_not_a_failure)
def test_gate_assertion_fails_on_a_silent_divergence(monkeypatch):
    monkeypatch.syspath_prepend(str(BROKEN_PLUGIN.parent))
    import broken_lm_plugin

    try:
        with pytest.raises(AssertionError, match=r"request \d+ \(\d+-token prompt\), async vs sync: .*\(stale row\)"):
            assert_async_equals_sync(broken_lm_plugin.BROKEN, [[1, 2, 3], [4, 5]], max_tokens=6)
    finally:
        registry.unregister(broken_lm_plugin.BROKEN)
        sys.modules.pop("broken_lm_plugin", None)


@pytest.mark.paid("ADO-5", before=verify_runs_pytest_specs)
def test_verify_reproves_the_spec_dirs_the_project_configures(tmp_path, monkeypatch, capsys):
    """A project whose pytest configuration names its spec folder (``tokenstate_specs``) gets it
    re-proved by ``tokenstate verify``, as plain ``pytest`` does — never a PASS with the specs not run."""
    import json
    import types

    (tmp_path / "pytest.ini").write_text("[pytest]\ntokenstate_specs = contract_specs\nxfail_strict = true\n")
    (tmp_path / "contract_specs").mkdir(exist_ok=True)
    (tmp_path / "contract_specs" / "mine.md").write_text(
        "# Mine\n\nThe contract.\n\n## Owed\n\n- **MINE-1** Not yet. — `../tests/test_mine.py::test_not_yet`\n\n## Paid\n"
    )
    (tmp_path / "tests").mkdir(exist_ok=True)  # the item's test lives with the project's other tests
    (tmp_path / "tests" / "test_mine.py").write_text(
        "import pytest\n\n@pytest.mark.owed('MINE-1')\ndef test_not_yet():\n    assert False\n\n"
        "def test_not_a_spec_test():\n    assert False  # not named by a spec: verify does not run it\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tokenstate.tools.verify.check_registry", lambda *a, **k: types.SimpleNamespace(results=[], findings=[], to_json=lambda: "{}"))
    monkeypatch.setattr("tokenstate.tools.verify.run_gates", lambda *a, **k: [])
    main(["verify", "--json"])
    ran = json.loads(capsys.readouterr().out)["specs"]
    assert ran["ran"] and ran["owed"] == 1 and ran["unhealthy"] == [], ran


@pytest.mark.paid("ADO-6", before=ledger_in_cwd_only)
def test_specs_run_from_a_subdirectory_reads_the_ledger_pytest_wrote_at_the_rootdir(tmp_path, monkeypatch):
    """pytest run in a subdirectory writes the ledger at its rootdir; ``tokenstate specs`` run there
    must read that one, not say "run the test suite first"."""
    from tokenstate.ledger import Ledger, LedgerEntry
    from tokenstate.ledger.report import main_specs

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / ".tokenstate").mkdir(exist_ok=True)
    owed = LedgerEntry("MINE-1", "mine", "owed", "tests/test_mine.py::test_x", "Not yet.", "specs/mine.md", 7, last_result="xfailed")
    Ledger([owed], []).write(tmp_path / ".tokenstate" / "ledger.json")
    (tmp_path / "specs" / "tests").mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path / "specs" / "tests")
    assert main_specs([]) == 0
