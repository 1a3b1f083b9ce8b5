"""mkdocs hooks of the tokenstate site (``hooks:`` in mkdocs.yml).

* ``on_config`` builds the API search tree for mkdocstrings (see ``site_api_tree``), reads the specs
  and the ledger once, and lists one nav entry per spec under "Specs".
* ``on_page_content`` renders the Sphinx roles docstrings use as code (see ``site_roles``).
* ``on_files`` adds the generated pages: ``specs/index.md``, ``specs/<slug>.md``,
  ``reference/cli.md`` and ``benchmarks.md``. They exist only in the build, never in ``docs/``.

The ledger is read from ``.tokenstate/ledger.json`` (the pytest plugin's default) or from the path in
``TOKENSTATE_DOCS_LEDGER``.
"""

from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from site_api_tree import build_api_tree
from site_benchmarks import RESULTS_FILE, render_benchmarks_page
from site_cli import render_cli_page
from site_roles import render_roles
from site_specs import (
    LedgerSource,
    load_repo_specs,
    read_ledger,
    render_spec_index,
    render_spec_page,
)

from tokenstate.contracts import ContractDefinitionError
from tokenstate.ledger import Spec

LEDGER_ENV = "TOKENSTATE_DOCS_LEDGER"
SPECS_NAV_TITLE = "Specs"

_state: dict[str, Any] = {"api_tree": None}


def _remove_api_tree() -> None:
    tree = _state.get("api_tree")
    if tree is not None:
        shutil.rmtree(tree, ignore_errors=True)
        _state["api_tree"] = None


atexit.register(_remove_api_tree)


def _repo_root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _spec_page(spec: Spec) -> str:
    return f"specs/{spec.slug}.md"


def _point_mkdocstrings_at(config: MkDocsConfig, tree: Path) -> None:
    plugin = config.plugins.get("mkdocstrings")
    if plugin is None:
        raise PluginError(
            "the tokenstate docs hooks need the mkdocstrings plugin enabled in mkdocs.yml"
        )
    handlers = plugin.config.handlers  # the dict the handler reads when it is first instantiated
    python = handlers.setdefault("python", {})
    python["paths"] = [str(tree)]
    # Attributes show their type and their own description (see site_griffe).
    here = Path(__file__).resolve().parent / "site_griffe.py"
    extensions = [f"{here}:InstanceAttributeValues", f"{here}:AttributeDescriptions"]
    options = python.setdefault("options", {})
    options["extensions"] = [*options.get("extensions", []), *extensions]


def _absolute_snippet_paths(config: MkDocsConfig, root: Path) -> None:
    # pymdownx.snippets resolves base_path against the working directory; the build must not
    # depend on where it was started.
    snippets = config.mdx_configs.get("pymdownx.snippets")
    if snippets is not None:
        snippets["base_path"] = [
            str((root / p).resolve()) for p in snippets.get("base_path", ["."])
        ]


def _fill_specs_nav(config: MkDocsConfig, specs: list[Spec]) -> None:
    entries: list[Any] = ["specs/index.md"] + [{spec.title: _spec_page(spec)} for spec in specs]
    for section in config.nav or []:
        if isinstance(section, dict) and SPECS_NAV_TITLE in section:
            section[SPECS_NAV_TITLE] = entries
            return
    raise PluginError(
        f"mkdocs.yml nav needs a top-level '{SPECS_NAV_TITLE}' entry for the generated spec pages"
    )


# Before every plugin: mkdocstrings instantiates its handler (reading `paths`) in its own on_config.
@event_priority(100)
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    root = _repo_root(config)
    _remove_api_tree()  # a rebuild under `mkdocs serve` starts from a fresh tree
    _state["api_tree"] = build_api_tree(root)
    _point_mkdocstrings_at(config, _state["api_tree"])
    _absolute_snippet_paths(config, root)
    try:
        specs = load_repo_specs(root)
    except ContractDefinitionError as exc:
        raise PluginError(
            f"the spec documents are malformed, so their pages cannot be built:\n{exc}"
        ) from exc
    ledger_path = Path(os.environ.get(LEDGER_ENV) or root / ".tokenstate" / "ledger.json")
    _state.update(root=root, specs=specs, ledger=read_ledger(ledger_path))
    _fill_specs_nav(config, specs)
    config.watch.extend(
        str(p) for p in (root / "specs", ledger_path, root / RESULTS_FILE) if p.exists()
    )
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root: Path = _state["root"]
    specs: list[Spec] = _state["specs"]
    ledger: LedgerSource = _state["ledger"]
    pages = {spec.slug: f"{spec.slug}.md" for spec in specs}  # links relative to specs/index.md
    files.append(
        File.generated(config, "specs/index.md", content=render_spec_index(specs, ledger, pages))
    )
    for spec in specs:
        files.append(
            File.generated(config, _spec_page(spec), content=render_spec_page(spec, ledger, root))
        )

    from tokenstate.tools.cli import build_parser

    files.append(
        File.generated(config, "reference/cli.md", content=render_cli_page(build_parser()))
    )
    try:
        benchmarks = render_benchmarks_page(root)
    except ValueError as exc:
        raise PluginError(str(exc)) from exc
    files.append(File.generated(config, "benchmarks.md", content=benchmarks))
    return files


def on_page_content(html: str, **kwargs: Any) -> str:
    return render_roles(html)
