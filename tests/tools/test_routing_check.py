"""`tokenstate check` over the project's own registry, and the CLI's exit codes."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tokenstate.checker import Verdict, check_entry_points
from tokenstate.contracts import ConfigError
from tokenstate.models.toy import toy_factory
from tokenstate.runtime import registry
from tokenstate.tools.routing_check import check_registry, main_check, target_of

REFERENCE_ARCHITECTURES = {
    "LlamaForCausalLM": "tokenstate.models.llama",
    "NemotronHForCausalLM": "tokenstate.models.nemotron_h",
    "KimiLinearForCausalLM": "tokenstate.models.kimi_linear",
}


@pytest.fixture
def toy_factories():
    """Three toy factories registered for one test: correct, host-ids bug, raw-buffer bug."""
    made = [
        toy_factory("CheckToyDevice", embed="device", honors=True),
        toy_factory("CheckToyHost", embed="host", honors=False),
        toy_factory("CheckToyRaw", embed="raw", honors=True),
    ]
    for factory in made:
        registry.register(factory)
    yield {f.name: f for f in made}
    for factory in made:
        registry.unregister(factory)


@pytest.mark.parametrize("architecture", sorted(REFERENCE_ARCHITECTURES))
def test_registered_reference_model_honors_as_declared(architecture: str) -> None:
    importlib.import_module("tokenstate.models")
    try:
        factory = registry.resolve(architecture)
    except ConfigError:
        pytest.skip(
            f"{architecture} is not registered yet (tokenstate.models does not register "
            f"{REFERENCE_ARCHITECTURES[architecture]}); the lead tightens this once it does"
        )
    (result,) = [r for r in check_registry().results if r.entry == factory.name]
    assert result.declared is True
    assert result.verdict is Verdict.HONORS, "\n".join(r.render() for r in result.routes)
    assert result.finding is None


@pytest.mark.parametrize("module_name", sorted(set(REFERENCE_ARCHITECTURES.values())))
def test_reference_model_source_honors_as_declared(module_name: str) -> None:
    """The same check straight from each reference module's factory, registered or not."""
    module = pytest.importorskip(module_name, reason=f"{module_name} is not written yet")
    factories = [v for v in vars(module).values() if isinstance(v, registry.ModelFactory)]
    assert factories, f"{module_name} defines no ModelFactory"
    report = check_entry_points([target_of(f) for f in factories])
    for result in report.results:
        assert result.declared is True, result.entry
        assert result.verdict is Verdict.HONORS, report.render()
        assert result.finding is None


def test_every_registered_factory_is_clean(toy_factories) -> None:
    report = check_registry()
    toys = set(toy_factories)
    clean = [r for r in report.results if r.entry not in toys]
    assert [r.entry for r in clean if r.finding] == [], report.render()


def test_toy_factories_get_their_verdicts_and_findings(toy_factories) -> None:
    results = {r.entry: r for r in check_registry().results}
    assert (
        results["CheckToyDevice"].verdict is Verdict.HONORS
        and results["CheckToyDevice"].finding is None
    )
    host = results["CheckToyHost"]
    assert host.verdict is Verdict.IGNORES and host.declared is False and host.finding
    assert "inp.host_tokens.ids (models/toy.py:" in host.routes[0].source
    assert results["CheckToyRaw"].verdict is Verdict.IGNORES
    assert target_of(toy_factories["CheckToyDevice"]).model_qualname == "_build"


def test_cli_exit_codes_and_json(toy_factories, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_check(["--json", "--module", "tokenstate.models.toy"]) == 1
    payload = json.loads(capsys.readouterr().out)
    verdicts = {r["entry"]: r["verdict"] for r in payload["results"]}
    assert verdicts == {
        "CheckToyDevice": "honors",
        "CheckToyHost": "ignores",
        "CheckToyRaw": "ignores",
    }
    assert payload["findings"] == 2

    registry.unregister(toy_factories["CheckToyHost"])
    registry.unregister(toy_factories["CheckToyRaw"])
    assert main_check(["--module", "tokenstate.models.toy"]) == 0
    assert "1 entry point(s) checked, 0 finding(s)." in capsys.readouterr().out


def test_cli_errors_are_one_line_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_check(["--module", "no_such_package_for_tokenstate_check"]) == 2
    err = capsys.readouterr().err
    assert "no module named 'no_such_package_for_tokenstate_check' in the current directory" in err
    assert "Traceback" not in err
    assert main_check(["--bogus"]) == 2


class _Runner:
    def forward(self, model: object, inp: object) -> object: ...


def test_a_forward_the_checker_cannot_locate_is_reported_and_the_others_still_checked(toy_factories):
    """One factory whose forward is a bound method must not end the run for every other model."""
    import dataclasses

    from tokenstate.contracts import entry_point

    bound = dataclasses.replace(toy_factory("CheckBoundMethod"), forward=entry_point(_Runner().forward))
    report = check_registry(selected=[bound, toy_factories["CheckToyDevice"]])
    unlocated, checked = report.results
    assert unlocated.entry == "CheckBoundMethod" and unlocated.verdict is Verdict.UNKNOWN
    assert "is not a module-level function" in unlocated.finding
    assert checked.entry == "CheckToyDevice" and checked.verdict is Verdict.HONORS


def test_a_package_without_factories_has_its_entry_point_forwards_checked(monkeypatch, capsys) -> None:
    """An engine of its own registers no ModelFactory: `--module` judges its @entry_point forwards."""
    own_engine = Path(__file__).resolve().parents[2] / "examples" / "own_engine"
    monkeypatch.chdir(own_engine)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(own_engine))])
    try:
        assert main_check(["--module", "my_engine"]) == 1
        out = capsys.readouterr().out
        assert "[ok] my_engine.model.forward: honors (an @entry_point forward, not registered)" in out
        assert "[FINDING] my_engine.model.forward_reads_host: ignores" in out
        assert "2 entry point(s) checked, 1 finding(s)." in out
    finally:
        for name in [m for m in sys.modules if m == "my_engine" or m.startswith("my_engine.")]:
            del sys.modules[name]


def test_a_package_with_neither_factories_nor_entry_points_names_both_routes(tmp_path, monkeypatch, capsys) -> None:
    """Nothing to check: the error names the two ways a package offers forwards to the checker."""
    (tmp_path / "empty_engine").mkdir()
    (tmp_path / "empty_engine" / "__init__.py").write_text("def forward(model, inp):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    try:
        assert main_check(["--module", "empty_engine"]) == 2
        err = capsys.readouterr().err
        assert "registered no ModelFactory" in err and "@entry_point" in err
    finally:
        sys.modules.pop("empty_engine", None)
