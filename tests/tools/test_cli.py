"""The ``tokenstate`` command line: help, exit codes, JSON, errors, and a broken plugin model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenstate.runtime import registry
from tokenstate.tools.cli import build_parser, main

PLUGINS = Path(__file__).resolve().parent / "plugins"
SUBCOMMANDS = ("demo", "check", "specs", "gate", "verify")


@pytest.fixture
def broken_plugin(monkeypatch):
    """Make ``--module broken_lm_plugin`` importable; unregister its model afterwards."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    yield "broken_lm_plugin"
    module = sys.modules.pop("broken_lm_plugin", None)
    if module is not None:
        registry.unregister(module.BROKEN)


def test_every_subcommand_has_complete_help(capsys):
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(subparsers.choices) == set(SUBCOMMANDS)
    for name, sub in subparsers.choices.items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)


def test_python_dash_m_tokenstate_works():
    out = subprocess.run([sys.executable, "-m", "tokenstate", "gate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--no-oracle" in out.stdout and "matched/total" in out.stdout


def test_errors_are_one_line_and_a_hint(capsys):
    assert main(["gate", "--model", "no-such-model", "--no-oracle"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("tokenstate gate: error: unknown architecture or model 'no-such-model'")
    assert err[1].startswith("hint: run with --debug") and len(err) == 2
    assert main(["--debug", "gate", "--model", "no-such-model", "--no-oracle"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_check_json_schema_and_exit_code(capsys):
    assert main(["check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["entry"] for r in report["results"]} >= {"llama", "kimi-linear"}
    assert all(r["verdict"] == "honors" for r in report["results"])


def test_gate_json_reports_matched_per_model_and_request(capsys):
    assert main(["gate", "--model", "tiny-llama", "--requests", "3", "--max-tokens", "6", "--no-oracle", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (model,) = data["models"]
    assert data["passed"] and model["model"] and model["totals"]["async vs sync"] == {"matched": 18, "total": 18}
    assert len(model["requests"]) == 3 and model["stats"]["async"]["async_steps"] > 0


def test_verify_passes_on_the_reference_models(capsys):
    code = main(["verify", "--model", "tiny-kimi-linear", "--requests", "3", "--max-tokens", "6", "--no-specs", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["passed"]
    assert set(data) == {"passed", "checker", "gate", "specs"}
    assert data["specs"]["ran"] is False and "--no-specs" in data["specs"]["note"]
    assert data["gate"][0]["totals"]["async vs oracle"]["matched"] == 18


def test_verify_fails_on_a_broken_plugin_model_and_pinpoints_the_stale_row(broken_plugin, capsys):
    code = main([
        "verify", "--module", broken_plugin, "--model", "broken-lm", "--requests", "4",
        "--max-tokens", "8", "--no-oracle", "--no-specs", "--json",
    ])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and not data["passed"]
    finding = next(r for r in data["checker"]["results"] if r["entry"] == "BrokenLM")
    assert finding["verdict"] == "ignores" and "broken_lm_plugin.py" in json.dumps(finding["routes"])
    (gate,) = data["gate"]
    diverged = [r["async vs sync"] for r in gate["requests"] if r["async vs sync"]["divergence"]]
    assert diverged, "the clamped placeholder must change tokens on the async path"
    first = diverged[0]["divergence"]
    assert first["stale"] is True and first["step"] is not None and first["row"] is not None
    assert first["expected"] != first["got"]


def test_gate_text_report_names_step_row_and_staleness(broken_plugin, capsys):
    code = main(["gate", "--module", broken_plugin, "--model", "broken-lm", "--requests", "2", "--max-tokens", "6", "--no-oracle"])
    out = capsys.readouterr().out
    assert code == 1
    assert "first divergence token" in out and "(stale row)" in out and "step" in out


def test_specs_command_reads_a_ledger(tmp_path, capsys):
    assert main(["specs", "--ledger", str(tmp_path / "missing.json")]) == 2
    assert "tokenstate specs: error:" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`tokenstate specs --json | head -1`: a closed pipe ends the command quietly."""
    import json
    import subprocess
    import sys
    import tempfile

    from tokenstate.ledger import Ledger

    code = (
        "import sys; from tokenstate.tools.cli import main; "
        "sys.exit(main(['specs', '--json', '--ledger', sys.argv[1]]))"
    )
    item = {"spec": "big", "state": "owed", "test": "t.py::test_x", "text": "x" * 100, "spec_file": "big.md", "spec_line": 1}
    with tempfile.TemporaryDirectory() as tmp:  # more JSON than a pipe holds (64 KiB)
        ledger = Path(tmp) / "ledger.json"
        ledger.write_text(json.dumps({**Ledger([], []).to_json(), "items": [{**item, "id": f"BIG-{i}"} for i in range(1, 2001)]}))
        proc = subprocess.Popen([sys.executable, "-c", code, str(ledger)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.read(10)
        proc.stdout.close()  # the reader leaves after a few bytes
        _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()[-800:]
