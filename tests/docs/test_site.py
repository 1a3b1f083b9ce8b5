"""The built site: strict build, every public API name documented, every spec item with its state."""

from __future__ import annotations

import html
import importlib
import re
from pathlib import Path

import pytest

from tokenstate.ledger import Ledger, load_specs

REPO = Path(__file__).resolve().parents[2]

# Each documented package and the reference page that documents its __all__.
REFERENCE_PAGES = {
    "tokenstate.contracts": "reference/contracts/index.html",
    "tokenstate.ledger": "reference/ledger/index.html",
    "tokenstate.checker": "reference/checker/index.html",
    "tokenstate.runtime": "reference/runtime/index.html",
    "tokenstate.runtime.kernels": "reference/kernels/index.html",
    "tokenstate.models.toy": "reference/testing/index.html",
    "tokenstate.testing": "reference/gate-api/index.html",
    "tokenstate.models": "reference/models/index.html",
}


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _ledger_rows(page_html: str) -> dict[str, str]:
    """``{item id: the HTML of its ledger table row}`` of a generated spec page."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page_html, flags=re.S):
        match = re.search(r'<span class="ts-item" id="([A-Z][A-Z0-9]*-\d+)">', row)
        if match:
            rows[match.group(1)] = row
    return rows


@pytest.mark.parametrize("package", sorted(REFERENCE_PAGES))
def test_every_public_name_is_documented(built_site: Path, package: str) -> None:
    page = _text(built_site / REFERENCE_PAGES[package])
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        # Documented under the name users import, or — for a name re-exported over a submodule of
        # the same name, which griffe resolves to the module — under its defining module's path.
        obj = getattr(module, name)
        canonical = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if f'id="{package}.{name}"' not in page and f'id="{canonical}"' not in page:
            missing.append(name)
    assert not missing, f"{package}: not documented on {REFERENCE_PAGES[package]}: {missing}"


def test_every_spec_page_shows_every_item_with_its_state(built_site: Path) -> None:
    specs = load_specs([REPO / "specs"])
    assert specs, "the repository has no spec documents"
    index = _text(built_site / "specs" / "index.html")
    for spec in specs:
        assert f'href="{spec.slug}/"' in index, f"specs index does not link {spec.slug}"
        rows = _ledger_rows(_text(built_site / "specs" / spec.slug / "index.html"))
        assert [r for r in rows] == [item.id for item in spec.items], (
            f"{spec.slug}: items differ from the spec"
        )
        for item in spec.items:
            assert f'class="ts-badge ts-{item.state}">{item.state}<' in rows[item.id], (
                f"{item.id} is {item.state} in {spec.slug}.md but its row does not say so"
            )
            assert html.escape(item.test_name) in rows[item.id].replace("<wbr>", "")


def test_spec_results_come_from_the_ledger(built_site: Path, site_ledger: Path) -> None:
    entries = {e.id: e for e in Ledger.read(site_ledger).items}
    shown = 0
    for spec in load_specs([REPO / "specs"]):
        rows = _ledger_rows(_text(built_site / "specs" / spec.slug / "index.html"))
        for item in spec.items:
            entry = entries.get(item.id)
            if (
                entry is None
                or entry.last_result is None
                or (entry.state, entry.test) != (item.state, item.test)
            ):
                assert "not run yet" in rows[item.id], (
                    f"{item.id}: a result the ledger does not hold"
                )
            else:
                assert "not run yet" not in rows[item.id], (
                    f"{item.id}: the ledger's result is missing"
                )
                shown += 1
    assert shown, "no item's result reached the spec pages"


def test_cli_reference_lists_every_subcommand(built_site: Path) -> None:
    from tokenstate.tools.cli import build_parser

    page = _text(built_site / "reference" / "cli" / "index.html")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in sub.choices:
        assert f"tokenstate {name}" in page, f"subcommand {name} missing from the CLI reference"


def test_overview_has_the_offline_diagram_and_every_nav_section(built_site: Path) -> None:
    page = _text(built_site / "index.html")
    assert "<svg" in page and "Asynchronous: step N+1 is prepared" in page
    for target in (
        "concepts/type-states/",
        "tutorial/",
        "how-to/own-engine/",
        "reference/contracts/",
        "reference/cli/",
        "specs/",
        "benchmarks/",
    ):
        assert f'href="{target}"' in page, f"the overview's navigation lacks {target}"


def test_tutorial_page_shows_the_executed_code(built_site: Path) -> None:
    page = _text(built_site / "tutorial" / "index.html")
    assert "--8&lt;--" not in page and "--8<--" not in page, "a snippet was not included"
    assert "honors_device_token_ids" in page and "embedding_ids" in page
