"""The file-level grep baseline vs the checker, over the zoo and the reference models."""

from __future__ import annotations

import importlib
import inspect

import pytest

from tokenstate.checker import Verdict, check_entry_points, grep_verdict, misclassified
from tokenstate.checker.report import EntryTarget

REFERENCE_MODULES = ("tokenstate.models.llama", "tokenstate.models.nemotron_h", "tokenstate.models.kimi_linear")


def _reference_targets() -> list[tuple[EntryTarget, str]]:
    """(target, source file) of every reference forward that exists yet."""
    from tokenstate.runtime.registry import ModelFactory
    from tokenstate.tools.routing_check import target_of

    found = []
    for name in REFERENCE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for factory in {id(v): v for v in vars(module).values() if isinstance(v, ModelFactory)}.values():
            found.append((target_of(factory), inspect.getsourcefile(module)))
    return found


def test_checker_has_no_false_positive_or_negative_where_grep_has_both(zoo) -> None:
    expected = {entry: verdict for entry, (verdict, _) in zoo.expected.items()}
    checker = {r.entry: r.verdict for r in zoo.run().results}
    grep = {entry: grep_verdict(zoo.file(entry)) for entry in expected}
    references = _reference_targets()
    if references:
        report = check_entry_points([t for t, _ in references])
        for (target, source), result in zip(references, report.results, strict=True):
            expected[target.name] = Verdict.HONORS
            checker[target.name] = result.verdict
            grep[target.name] = grep_verdict(source)
    checker_fp, checker_fn = misclassified(checker, expected)
    grep_fp, grep_fn = misclassified(grep, expected)
    assert (checker_fp, checker_fn) == ([], [])
    # grep flags delegation (helpers in another file, module/class aliases, pooling) ...
    assert {"czoo.calls.via_helper", "czoo.aliases.module_alias", "czoo.inert.position_pooling"} <= set(grep_fp)
    if any(t.name == "nemotron-h" for t, _ in references):
        assert "nemotron-h" in grep_fp  # the scope: its file never names the device field
    # ... and passes files whose text names the field while a route embeds host ids
    assert {"czoo.comment_lies.mentions_device_tokens", "czoo.scoped_models.contextvar_scope_host"} <= set(grep_fn)
    assert len(grep_fp) >= 5 and len(grep_fn) >= 5, (grep_fp, grep_fn)


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("def f(inp): return embed(inp.device_tokens.ids)", Verdict.HONORS),
        ("def f(inp): return embed(inp.host_tokens.ids)", Verdict.IGNORES),
        ("def f(inp): return pool(inp.positions)", Verdict.INERT),
    ],
)
def test_grep_baseline_is_the_text_rule(tmp_path, text: str, verdict: Verdict) -> None:
    path = tmp_path / "model.py"
    path.write_text(text)
    assert grep_verdict(path) is verdict
