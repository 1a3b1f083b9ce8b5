"""What a new user trips on at the command line: --module, scoping, early refusals, CI-width tables."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tokenstate.checker.report import Verdict
from tokenstate.contracts import set_checks_mode
from tokenstate.runtime import registry
from tokenstate.runtime.progress import observe_steps
from tokenstate.tools.cli import main
from tokenstate.tools.gate import GateConfig, GateReport, PathResult, run_gate
from tokenstate.tools.gate_cli import render_gate
from tokenstate.tools.gate_matrix import CellReport
from tokenstate.tools.routing_check import check_registry
from tokenstate.tools.verify import _render_checker

PLUGIN = Path(__file__).resolve().parent / "plugins" / "broken_lm_plugin.py"


@pytest.fixture
def broken_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN.parent))
    yield "broken_lm_plugin"
    module = sys.modules.pop("broken_lm_plugin", None)
    if module is not None:
        registry.unregister(module.BROKEN)


@pytest.mark.parametrize(
    "argv",
    [["check"], ["gate", "--model", "tiny-llama", "--no-oracle"], ["verify", "--no-specs"], ["specs"], ["demo"]],
    ids=lambda argv: argv[0],
)
def test_a_bogus_checks_mode_is_refused_by_every_command(argv, monkeypatch, capsys):
    monkeypatch.setenv("TOKENSTATE_CHECKS", "bogus")
    set_checks_mode(None)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"tokenstate {argv[0]}: error: TOKENSTATE_CHECKS='bogus' is not a checks mode; valid values: "
        "off, boundary, full (default: boundary)."
    )


OWED_SPEC = "# Mine\n\nThe contract.\n\n## Owed\n\n- **MINE-1** Not yet. — `tests/test_mine.py::test_not_yet`\n\n## Paid\n"
OWED_TEST = "import pytest\n\n@pytest.mark.owed('MINE-1')\ndef test_not_yet():\n    assert False\n"
PYTEST_CONFIG = {
    "pyproject.toml": "[tool.pytest.ini_options]\nxfail_strict = true\n",
    "pytest.ini": "[pytest]\nxfail_strict = true\n",
    "tox.ini": "[pytest]\nxfail_strict = true\n",
    "setup.cfg": "[tool:pytest]\nxfail_strict = true\n",
}


def _skip_checker_and_gate(monkeypatch):
    import types

    empty = types.SimpleNamespace(results=[], findings=[], to_json=lambda: "{}")
    monkeypatch.setattr("tokenstate.tools.verify.check_registry", lambda *a, **k: empty)
    monkeypatch.setattr("tokenstate.tools.verify.run_gates", lambda *a, **k: [])


@pytest.mark.parametrize("project_file", sorted(PYTEST_CONFIG))
def test_verify_from_a_subfolder_reproves_the_specs_of_a_project_configured_by_any_pytest_file(
    project_file, tmp_path, monkeypatch, capsys
):
    """docs/how-to/spec-example uses a pytest.ini, no pyproject.toml: verify run anywhere inside the
    project must find its rootdir and specs/ as pytest does, and re-prove them."""
    (tmp_path / project_file).write_text(PYTEST_CONFIG[project_file])
    (tmp_path / "specs" / "tests").mkdir(parents=True)
    (tmp_path / "specs" / "mine.md").write_text(OWED_SPEC)
    (tmp_path / "specs" / "tests" / "test_mine.py").write_text(OWED_TEST)
    (tmp_path / "pkg").mkdir()
    monkeypatch.chdir(tmp_path / "pkg")
    _skip_checker_and_gate(monkeypatch)
    assert main(["verify", "--json"]) == 0
    specs = json.loads(capsys.readouterr().out)["specs"]
    assert (specs["ran"], specs["owed"], specs["unhealthy"]) == (True, 1, []), specs


def test_verify_without_specs_says_where_it_looked_and_fails_only_when_specs_were_asked_for(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    monkeypatch.chdir(tmp_path)
    _skip_checker_and_gate(monkeypatch)
    assert main(["verify", "--json"]) == 0  # a project without specs has nothing to re-prove
    specs = json.loads(capsys.readouterr().out)["specs"]
    assert not specs["ran"] and specs["note"].startswith("no spec documents in specs (pytest's tokenstate_specs")
    assert main(["verify", "--json", "--specs", str(tmp_path)]) == 1  # asked for by name: a failure
    assert json.loads(capsys.readouterr().out)["specs"]["unhealthy"]
    (tmp_path / "pytest.ini").write_text("[pytest]\ntokenstate_specs = contracts\n")  # named, missing
    assert main(["verify", "--json"]) == 1
    assert "named by tokenstate_specs do not exist" in json.loads(capsys.readouterr().out)["specs"]["note"]


def test_verify_refuses_a_missing_specs_dir_before_anything_runs(monkeypatch, capsys, tmp_path):
    def must_not_run(*args, **kwargs):
        raise AssertionError("verify ran a step before refusing --specs")

    monkeypatch.setattr("tokenstate.tools.verify.check_registry", must_not_run)
    monkeypatch.setattr("tokenstate.tools.verify.run_gates", must_not_run)
    assert main(["verify", "--specs", "/nonexistent"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "tokenstate verify: error: --specs /nonexistent: no such directory; pass a folder of the "
        "project whose specs to re-prove."
    )


def test_verify_fails_when_the_spec_run_breaks_before_writing_its_ledger(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "demo.md").write_text("# Demo\n\n## Owed\n\n## Paid\n")
    (tmp_path / "conftest.py").write_text("raise RuntimeError('conftest boom')\n")
    code = main([
        "verify", "--model", "tiny-llama", "--quick", "--no-oracle", "--requests", "2", "--max-tokens", "4",
        "--specs", str(tmp_path),
    ])
    out = capsys.readouterr().out
    assert code == 1
    assert "verify: FAIL" in out and "the spec run failed" in out and "conftest boom" in out


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--max-num-seqs", "0"], "gate: max_num_seqs must be a positive int, got 0."),
        (["--device", "cuda"], "LLM: device='cuda' but CUDA is not available here; use device='cpu'."),
    ],
    ids=["max-num-seqs", "cuda"],
)
def test_verify_refuses_a_bad_gate_setting_before_the_checker_runs(option, message, monkeypatch, capsys):
    if "cuda" in option:
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)

    def must_not_run(*args, **kwargs):
        raise AssertionError("verify ran the checker before refusing the gate's settings")

    monkeypatch.setattr("tokenstate.tools.verify.check_registry", must_not_run)
    assert main(["verify", "--no-specs", *option]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f"tokenstate verify: error: {message}"


def test_check_module_imports_a_package_from_the_current_directory(tmp_path):
    tokenstate = shutil.which("tokenstate", path=str(Path(sys.executable).parent))
    assert tokenstate, "the console script is installed next to the interpreter"
    package = tmp_path / "myengine"
    package.mkdir()
    (package / "__init__.py").write_text(PLUGIN.read_text())
    run = subprocess.run([tokenstate, "check", "--module", "myengine"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr  # imported; its forward embeds host ids
    assert "BrokenLM: ignores" in run.stdout and "myengine/__init__.py" in run.stdout
    assert "kimi-linear" not in run.stdout  # --module restricts check to the package's forwards


def test_an_unimportable_module_says_where_it_was_looked_for(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--module", "no_such_engine_pkg"]) == 2
    err = capsys.readouterr().err.splitlines()[0]
    assert err == (
        f"tokenstate check: error: --module no_such_engine_pkg: no module named 'no_such_engine_pkg' "
        f"in the current directory ({tmp_path}) or on sys.path; run from the directory that holds "
        "the package, install it (pip install -e .), or add its parent to PYTHONPATH."
    )
    (tmp_path / "needs_dep.py").write_text("import a_dependency_that_is_missing  # noqa\n")
    try:
        assert main(["gate", "--module", "needs_dep"]) == 2
        assert (
            "--module needs_dep: importing it failed: No module named 'a_dependency_that_is_missing'."
            in capsys.readouterr().err
        )
    finally:
        sys.modules.pop("needs_dep", None)


@pytest.mark.parametrize(
    ("name", "source", "message"),
    [
        ("bad_syntax_pkg", "def broken(:\n", "importing it raised SyntaxError"),
        ("raising_pkg", "raise RuntimeError('no GPU here')\n", "importing it raised RuntimeError: no GPU here"),
        ("exiting_pkg", "import sys\nsys.exit(3)\n", "importing it called sys.exit(3)"),
        ("", None, "'' is not a module name"),
        ("../up", None, "'../up' is not a module name"),
    ],
)
def test_a_module_that_fails_to_import_is_a_usage_error_not_a_finding(capsys, tmp_path, monkeypatch, name, source, message):
    """Exit 2 (bad invocation), never 1 (findings), and no traceback: CI must tell them apart."""
    monkeypatch.chdir(tmp_path)
    if source is not None:
        (tmp_path / f"{name}.py").write_text(source)
    try:
        assert main(["check", "--module", name]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    finally:
        sys.modules.pop(name, None)


def test_module_scope_includes_factories_it_registers_around_library_forwards(capsys, tmp_path, monkeypatch):
    """A package that registers the toy forward under its own architecture is that package's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reuses_forward_pkg.py").write_text(
        "import dataclasses\n"
        "from tokenstate.models.toy import toy_factory\n"
        "from tokenstate.runtime import register\n"
        "FACTORY = register(toy_factory('ReusedForwardLM'))\n"
    )
    try:
        assert main(["check", "--module", "reuses_forward_pkg"]) == 0
        out = capsys.readouterr().out
        assert "ReusedForwardLM: honors" in out and "kimi-linear" not in out
    finally:
        module = sys.modules.pop("reuses_forward_pkg", None)
        if module is not None:
            registry.unregister(module.FACTORY)


def test_module_restricts_gate_and_verify_as_it_restricts_check(broken_plugin, capsys):
    assert main(["gate", "--module", broken_plugin, "--requests", "2", "--max-tokens", "4", "--no-oracle", "--json"]) == 1
    assert [m["model"] for m in json.loads(capsys.readouterr().out)["models"]] == ["BrokenLM"]
    code = main(["verify", "--module", broken_plugin, "--requests", "2", "--max-tokens", "4", "--no-oracle", "--no-specs", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [r["entry"] for r in data["checker"]["results"]] == ["BrokenLM"]
    assert [g["model"] for g in data["gate"]] == ["BrokenLM"]


def test_verify_model_scopes_the_checker_too(capsys):
    code = main(["verify", "--model", "tiny-llama", "--requests", "2", "--max-tokens", "4", "--no-oracle", "--no-specs", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [r["entry"] for r in data["checker"]["results"]] == ["llama"]
    assert [g["model"] for g in data["gate"]] == ["llama"]


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=80, color_system=None, force_terminal=False), buffer


def test_gate_table_keeps_long_model_names_whole_at_80_columns():
    names = ["my-organisation-kimi-linear-48b", "nemotron-h", "kimi-linear"]
    reports = [
        GateReport(model=name, comparisons=["async vs sync"], requests=[{"async vs sync": PathResult("async vs sync", 4, 4, None)}], prompt_lens=[3])
        for name in names
    ]
    console, buffer = _console()
    render_gate(reports, console)
    text = buffer.getvalue()
    assert all(name in text for name in names) and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_schedule_matrix_keeps_model_names_whole_at_80_columns():
    name = "TinyRecurrentLM-from-the-tutorial"
    cells = [
        CellReport("random row order", "…", conditions=[]),
        CellReport("n-gram drafts", "…", skipped=f"model {name!r} does not support n-gram drafts"),
    ]
    console, buffer = _console()
    render_gate([GateReport(model=name, comparisons=["async vs sync"], cells=cells)], console)
    text = buffer.getvalue()
    assert text.count(name) >= 2 and "TinyRecurrent…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_checker_table_keeps_entry_names_whole_at_80_columns():
    console, buffer = _console()
    _render_checker(check_registry(), console)
    text = buffer.getvalue()
    assert all(name in text for name in ("llama", "nemotron-h", "kimi-linear")) and "…" not in text


def test_gate_progress_advances_in_tokens_within_one_model():
    config = GateConfig(num_requests=3, max_tokens=5, oracle=False, quick=True)  # the baseline's tokens
    seen: list[int] = []
    with observe_steps(lambda finished: seen.append(sum(len(o.token_ids) for o in finished))):
        run_gate("tiny-llama", config)
    assert sum(seen) == 2 * config.num_requests * config.max_tokens  # both paths, every token
    assert len([n for n in seen if n]) >= 2 * config.num_requests // 2  # many updates, not one per model


@pytest.mark.parametrize("argv", [["--debug", "gate", "--model", "NoSuchLM"], ["gate", "--model", "NoSuchLM", "--debug"]])
def test_debug_shows_the_traceback_before_or_after_the_command(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "unknown architecture or model 'NoSuchLM'" in err
    assert "run with --debug" not in err  # it did


def test_without_debug_there_is_no_traceback(capsys):
    assert main(["gate", "--model", "NoSuchLM"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hint: run with --debug" in err


def test_bracketed_text_in_errors_reaches_the_terminal_whole():
    """Shapes like ``[num_logits, vocab]`` in an error or a finding are text, not console markup."""
    error = "ContractViolation: returns float logits [num_logits, vocab] for inp.logits_indices [bold]"
    cell = CellReport("n-gram drafts [x]", "…", errors={"async": error}, skipped="")
    report = GateReport(model="m[1]", comparisons=["async vs sync"], errors={"async": error}, cells=[cell])
    console, buffer = _console()
    render_gate([report], console)
    text = " ".join(buffer.getvalue().split())
    assert "the async path raised ContractViolation: returns float logits [num_logits, vocab] for" in text
    assert "cell 'n-gram drafts [x]', async path raised ContractViolation: returns float logits [num_logits, vocab]" in text
    assert "m[1]" in text


    checker = SimpleNamespace(results=[SimpleNamespace(entry="fwd[0]", declared=True, verdict=Verdict.IGNORES, finding="reads [host] ids", routes=[])], findings=[])
    console, buffer = _console()
    _render_checker(checker, console)
    assert "fwd[0]" in buffer.getvalue() and "reads [host] ids" in buffer.getvalue()


def test_check_model_scopes_the_checker_like_gate_and_verify(capsys):
    assert main(["check", "--model", "tiny-llama", "--json"]) == 0
    assert [r["entry"] for r in json.loads(capsys.readouterr().out)["results"]] == ["llama"]
    assert main(["check", "--model", "NoSuchLM"]) == 2
    assert "unknown architecture or model 'NoSuchLM'" in capsys.readouterr().err


def test_gate_max_tokens_default_is_fitted_to_the_context_and_an_explicit_one_is_not():
    from tokenstate.tools.cli import build_parser
    from tokenstate.tools.gate_cli import gate_config

    default = gate_config(build_parser().parse_args(["verify"]))
    assert (default.max_tokens, default.fit_max_tokens) == (32, True)
    explicit = gate_config(build_parser().parse_args(["gate", "--max-tokens", "32"]))
    assert (explicit.max_tokens, explicit.fit_max_tokens) == (32, False)


def test_specs_shows_the_ledger_verify_just_proved(tmp_path, monkeypatch, capsys):
    """`tokenstate verify` re-proves the spec ledger; `tokenstate specs` afterwards shows that run."""
    import json
    import types

    (tmp_path / "pytest.ini").write_text("[pytest]\nxfail_strict = true\n")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mine.md").write_text(
        "# Mine\n\nThe contract.\n\n## Owed\n\n- **MINE-1** Not yet. — `tests/test_mine.py::test_not_yet`\n\n## Paid\n"
    )
    (tmp_path / "specs" / "tests").mkdir()
    (tmp_path / "specs" / "tests" / "test_mine.py").write_text(
        "import pytest\n\n@pytest.mark.owed('MINE-1')\ndef test_not_yet():\n    assert False\n"
    )
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tokenstate.tools.verify.check_registry", lambda *a, **k: types.SimpleNamespace(results=[], findings=[], to_json=lambda: "{}"))
    monkeypatch.setattr("tokenstate.tools.verify.run_gates", lambda *a, **k: [])
    main(["verify", "--json"])
    assert json.loads(capsys.readouterr().out)["specs"]["owed"] == 1
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["specs", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(e["id"], e["last_result"]) for e in shown["items"]] == [("MINE-1", "xfailed")]
    assert shown["root"] == str(tmp_path)


@pytest.mark.parametrize("command", ["verify", "check", "gate"])
def test_a_json_run_that_fails_to_start_still_prints_json(command, capsys):
    assert main([command, "--module", "no_such_package_for_tokenstate_json", "--json"]) == 2
    captured = capsys.readouterr()
    reported = json.loads(captured.out)
    assert reported["passed"] is False and "no_such_package_for_tokenstate_json" in reported["error"]
    assert "error:" in captured.err


def test_an_architecture_transformers_does_not_know_runs_the_gate_without_the_oracle_and_says_why():
    """A model of the user's own that can save HF-format weights, whose architecture transformers
    has no class for: the gate crashed with transformers' raw ValueError. Now the oracle columns are
    left out and the report says why; asked for explicitly in the Python API, it is a ConfigError."""
    pytest.importorskip("transformers")
    from tokenstate.contracts import ConfigError
    from tokenstate.models.toy import toy_factory
    from tokenstate.testing import assert_async_equals_sync

    report = run_gate(toy_factory("MineLM"), GateConfig(num_requests=2, max_tokens=4, quick=True))
    assert report.passed and report.comparisons == ["async vs sync"]
    assert "transformers cannot load" in report.oracle_note and "MineLM" in report.oracle_note
    assert report.to_json()["oracle_note"] == report.oracle_note
    console = Console(file=io.StringIO(), width=200)
    render_gate([report], console)
    assert "oracle not run for MineLM: transformers cannot load" in console.file.getvalue()
    with pytest.raises(ConfigError, match=r"transformers cannot load.*oracle=False"):
        assert_async_equals_sync(toy_factory("MineLM"), num_requests=2, max_tokens=4, oracle=True)
