"""The reference pages read well: no raw Sphinx roles, no constructor code for attributes, no intro
said twice, every counter described, CLI defaults shown, test names that wrap between words."""

from __future__ import annotations

import argparse
import html
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = re.compile(r":(?:py:)?(?:meth|class|func|mod|attr|data|exc|obj|const):")


def _pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def _article_text(page: Path) -> str:
    article = page.read_text(encoding="utf-8").split("<article", 1)[-1].split("</article>", 1)[0]
    return html.unescape(re.sub(r"<[^>]+>", "", article))


def test_no_page_shows_a_raw_sphinx_role(built_site: Path) -> None:
    offenders = {
        str(p.relative_to(built_site)): ROLE.findall(_article_text(p))
        for p in _pages(built_site)
        if ROLE.search(_article_text(p))
    }
    assert not offenders, f"raw :role: markup on {offenders}"


def test_roles_become_code_linked_to_their_heading(built_site: Path) -> None:
    page = (built_site / "reference" / "runtime" / "index.html").read_text(encoding="utf-8")
    # RequestOutput's docstring says :class:`TokenOrigin`; the page documents TokenOrigin.
    assert '<a class="autorefs autorefs-internal" href="#tokenstate.runtime.TokenOrigin"><code>TokenOrigin</code></a>' in page


def _attribute_signatures(page: Path) -> dict[str, str]:
    """``{attribute id: its rendered signature}`` for every attribute heading of an API page."""
    text = page.read_text(encoding="utf-8")
    found = {}
    for match in re.finditer(r'<h[2-6] id="([\w.]+)" class="doc doc-heading">', text):
        rest = text[match.end():match.end() + 4000]
        if "doc-symbol-attribute" not in rest[:400]:
            continue
        code = re.search(r"<pre[^>]*>(.*?)</pre>", rest, re.S)
        if code:
            found[match.group(1)] = html.unescape(re.sub(r"<[^>]+>", "", code.group(1))).strip()
    return found


def test_instance_attributes_show_their_type_not_the_constructor_code(built_site: Path) -> None:
    signatures = {}
    for page in (built_site / "reference").rglob("index.html"):
        signatures.update(_attribute_signatures(page))
    assert signatures["tokenstate.runtime.LLM.seed"] == "seed: int"
    assert signatures["tokenstate.runtime.EngineStats.async_steps"] == "async_steps: int = 0"
    echoes = [s for s in signatures.values() if re.fullmatch(r"(\w+)(?::[^=]*)? = \1", s)]
    assert not echoes, f"attributes shown as `x = x`: {echoes}"


def test_every_engine_stats_counter_is_described_on_its_own(built_site: Path) -> None:
    from tokenstate.runtime import EngineStats

    text = (built_site / "reference" / "runtime" / "index.html").read_text(encoding="utf-8")
    for name in [*EngineStats.__dataclass_fields__, "total_steps", "as_dict"]:
        anchor = f'id="tokenstate.runtime.EngineStats.{name}"'
        assert anchor in text, name
        after = text.split(anchor + ' class="doc doc-heading">', 1)[1].split('class="doc doc-heading"', 1)[0]
        description = re.search(r'<div class="doc doc-contents\s*">\s*(.*?)</div>', after, re.S)
        assert description and "<p>" in description.group(1), f"EngineStats.{name} has no description"


@pytest.mark.parametrize("page", ["contracts", "ledger", "checker", "runtime", "kernels", "models", "testing"])
def test_a_reference_page_does_not_restate_its_module_docstring(page: str) -> None:
    source = (REPO / "docs" / "reference" / f"{page}.md").read_text(encoding="utf-8")
    intro = source.split(":::", 1)[0].splitlines()[1:]  # below the title, above the API block
    prose = " ".join(line for line in intro if line.strip())
    assert len(prose) < 120, f"reference/{page}.md restates its module docstring: {prose!r}"


@pytest.fixture
def site_cli(hooks_on_path: None) -> ModuleType:
    return importlib.import_module("site_cli")


def test_cli_page_shows_every_default(site_cli: ModuleType) -> None:
    from tokenstate.tools.cli import build_parser

    page = site_cli.render_cli_page(build_parser())
    rows = [line for line in page.splitlines() if line.startswith("| <code>")]
    assert rows and all(line.rsplit("|", 2)[-2].strip() for line in rows), "a blank Default cell"
    assert "| <code>--json</code> | print one JSON document instead of tables |  | off |" in page
    assert "| TOKENSTATE_CHECKS, else boundary |" in page
    assert "| the current directory |" in page
    assert "| the nearest .tokenstate/ledger.json at or above the current directory |" in page


def test_cli_default_of_a_path_option_is_the_path(site_cli: ModuleType) -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--ledger", type=Path, default=Path(".tokenstate/ledger.json"), help="where")
    assert "| .tokenstate/ledger.json |" in site_cli.render_cli_page(parser)


def test_spec_test_names_wrap_between_words_only(built_site: Path) -> None:
    css = (REPO / "docs" / "stylesheets" / "tokenstate.css").read_text(encoding="utf-8")
    assert "overflow-wrap: anywhere" not in css.split(".ts-ledger", 1)[1].split("/* API", 1)[0]
    page = (built_site / "specs" / "stale-host-ids" / "index.html").read_text(encoding="utf-8")
    assert "<code>test_<wbr>predicate_<wbr>pinned_<wbr>between_<wbr>kernel_<wbr>and_<wbr>twin</code>" in page


def test_no_docs_page_has_a_stray_one_letter_line() -> None:
    for path in (REPO / "docs").rglob("*.md"):
        stray = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if re.fullmatch(r"\s*[A-Za-z]\s*", line)]
        assert not stray, f"{path.relative_to(REPO)}: stray line(s) {stray}"


def test_docs_say_which_twin_runs_on_the_cpu() -> None:
    # combine and post-update run numpy host twins on the CPU (backend="auto"), not torch twins.
    for path in [REPO / "README.md", *(REPO / "docs").rglob("*.md"), REPO / "runtime" / "kernels" / "__init__.py"]:
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert "as their torch twins on CPU tensors" not in text, path
        assert "each pinned to a torch twin" not in text, path
        assert "its torch twin (`*_twin`, identical semantics) on CPU tensors" not in text, path
    kernels = importlib.import_module("tokenstate.runtime.kernels").__doc__ or ""
    assert "numpy host twins" in " ".join(kernels.split())


def test_readme_states_what_was_measured_where() -> None:
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "about 80 s" not in text
    assert "`tokenstate verify` 206 s and `tokenstate verify --quick` 148 s" in text
    assert "209 s from a fresh clone, install included, on a loaded machine (an earlier, smaller ledger)" in text
