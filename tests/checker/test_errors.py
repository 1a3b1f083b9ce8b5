"""Missing or unparsable source and checker failures become findings that name the file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokenstate.checker import CheckerConfig, EntryTarget, Verdict, check_entry_points
from tokenstate.checker.engine import Analyzer


def _package(tmp_path: Path, files: dict[str, str]) -> CheckerConfig:
    root = tmp_path / "pkgs"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return CheckerConfig(search_paths=(root,), display_root=root)


def test_unparsable_entry_module_is_a_finding_naming_the_file(tmp_path: Path) -> None:
    config = _package(tmp_path, {"brokenpkg/__init__.py": "", "brokenpkg/model.py": "def forward(model, inp:\n"})
    (result,) = check_entry_points([EntryTarget("broken", "brokenpkg.model", "forward", True)], config).results
    assert result.verdict is Verdict.UNKNOWN
    assert result.finding is not None and "brokenpkg/model.py" in result.finding and "cannot parse line 1" in result.finding


def test_missing_module_and_missing_function_are_findings(tmp_path: Path) -> None:
    config = _package(tmp_path, {"okpkg/__init__.py": "", "okpkg/model.py": "X = 1\n"})
    missing_module, missing_function = check_entry_points(
        [EntryTarget("a", "nosuchpkg_for_checker.model", "forward"), EntryTarget("b", "okpkg.model", "forward")],
        config,
    ).results
    assert "nosuchpkg_for_checker.model" in (missing_module.finding or "")
    assert "no function forward found in module okpkg.model" in (missing_function.finding or "")


def test_unparsable_callee_makes_the_route_unknown_and_names_the_file(tmp_path: Path) -> None:
    config = _package(tmp_path, {
        "halfpkg/__init__.py": "",
        "halfpkg/helpers.py": "def embed(ids, w):\n    return (\n",
        "halfpkg/model.py": (
            "from halfpkg.helpers import embed\n"
            "def forward(model, inp):\n"
            "    return embed(inp.embedding_ids(), None)\n"
        ),
    })
    (result,) = check_entry_points([EntryTarget("half", "halfpkg.model", "forward")], config).results
    assert result.verdict is Verdict.UNKNOWN
    assert any("halfpkg/helpers.py" in r.source and "cannot parse" in r.source for r in result.routes)


def test_an_internal_failure_is_reported_per_entry_point_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _package(tmp_path, {"fine/__init__.py": "", "fine/model.py": "def forward(model, inp):\n    return 0\n"})

    def explode(self, *args: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(Analyzer, "analyse", explode)
    (result,) = check_entry_points([EntryTarget("fine", "fine.model", "forward")], config).results
    assert result.verdict is Verdict.UNKNOWN
    assert result.finding is not None and "internal checker error (KeyError" in result.finding


def test_declared_false_but_honouring_is_a_finding(tmp_path: Path) -> None:
    config = _package(tmp_path, {
        "decl/__init__.py": "",
        "decl/model.py": (
            "from tokenstate.runtime.kernels import guarded_embedding\n"
            "def forward(model, inp):\n"
            "    return guarded_embedding(inp.embedding_ids(), None)\n"
        ),
    })
    honest, shy = check_entry_points(
        [EntryTarget("honest", "decl.model", "forward", True), EntryTarget("shy", "decl.model", "forward", False)],
        config,
    ).results
    assert honest.verdict is shy.verdict is Verdict.HONORS
    assert honest.finding is None
    assert shy.finding is not None and "declares honors_device_token_ids=False" in shy.finding


def test_analysed_code_is_read_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported.txt"
    config = _package(tmp_path, {
        "sideeffect/__init__.py": f"open({str(marker)!r}, 'w').close()\n",
        "sideeffect/model.py": (
            f"open({str(marker)!r}, 'w').close()\n"
            "raise SystemExit('importing this module is forbidden')\n"
            "def forward(model, inp):\n"
            "    return inp.host_tokens.ids\n"
        ),
    })
    (result,) = check_entry_points([EntryTarget("side", "sideeffect.model", "forward")], config).results
    assert result.verdict is Verdict.IGNORES  # embeds nothing, but reading host ids is a finding
    assert not marker.exists()
    assert "sideeffect" not in sys.modules and "sideeffect.model" not in sys.modules


@pytest.mark.parametrize(
    ("rebinding", "verdict"),
    [
        ("", Verdict.HONORS),  # every binding is a literal loop: the names are read one by one
        ("    name, other = 'table', 0\n", Verdict.UNKNOWN),  # a tuple target: anything
        ("    import table as name\n", Verdict.UNKNOWN),
        ("    name += 'x'\n", Verdict.UNKNOWN),
    ],
)
def test_a_local_name_is_fixed_only_when_every_binding_is(tmp_path: Path, rebinding: str, verdict: Verdict) -> None:
    config = _package(tmp_path, {
        "names/__init__.py": "",
        "names/model.py": (
            "import torch\n"
            "class M(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.table = torch.nn.Embedding(4, 2)\n"
            "def forward(model: M, inp):\n"
            "    for name in ['table']:\n"
            "        layer = getattr(model, name)\n"
            f"{rebinding}"
            "    return layer(inp.embedding_ids())\n"
        ),
    })
    (result,) = check_entry_points([EntryTarget("n", "names.model", "forward")], config).results
    assert result.verdict is verdict, result.routes


def test_a_class_handed_down_more_helpers_than_are_read_is_patched_anywhere(tmp_path: Path) -> None:
    helpers = "".join(f"def h{i}(c):\n    h{i + 1}(c)\n" for i in range(4)) + "def h4(c):\n    c.forward = None\n"
    config = _package(tmp_path, {
        "deep/__init__.py": "",
        "deep/model.py": (
            "import torch\n" + helpers +
            "def patch(cls):\n    h0(cls)\n    return cls\n"
            "@patch\n"
            "class M(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.table = torch.nn.Embedding(4, 2)\n"
            "    def forward(self, inp):\n"
            "        return self.table(inp.embedding_ids())\n"
            "def forward(model: M, inp):\n"
            "    return model(inp)\n"
        ),
    })
    (result,) = check_entry_points([EntryTarget("d", "deep.model", "forward")], config).results
    assert result.verdict is Verdict.UNKNOWN, result.routes
