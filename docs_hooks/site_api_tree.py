"""A package tree that griffe can read, whatever way tokenstate was installed.

The three code folders sit at the repository root and are mapped under ``tokenstate`` by setuptools
``package-dir``. A lenient editable install resolves that mapping with an import hook, which griffe
(hence mkdocstrings) does not run, so ``tokenstate.contracts`` would be invisible to the API pages.
Instead of depending on how the package was installed, the docs build assembles the package as it
will be installed — ``src/tokenstate`` at the top, ``contracts/``, ``runtime/`` and ``models/`` under
it — out of symbolic links in a temporary folder, and points mkdocstrings' python handler at it.
The mapping is read from ``pyproject.toml``, so a new top-level mapping needs no change here.
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from pathlib import Path

__all__ = ["build_api_tree", "package_dirs"]

PACKAGE = "tokenstate"


def package_dirs(repo_root: Path) -> dict[str, Path]:
    """``{"tokenstate": src/tokenstate, "tokenstate.contracts": contracts, ...}`` from pyproject.toml."""
    pyproject = tomllib.loads((repo_root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    return {name: (repo_root / folder).resolve() for name, folder in mapping.items()}


def build_api_tree(repo_root: Path, parent: Path | None = None) -> Path:
    """Create ``<tmp>/tokenstate`` mirroring the installed layout; return ``<tmp>`` (a search path).

    The caller owns the returned folder and removes it with :func:`shutil.rmtree` when done.
    """
    dirs = package_dirs(repo_root)
    if PACKAGE not in dirs:
        raise RuntimeError(
            f"pyproject.toml maps no folder to {PACKAGE!r}; cannot build the API tree."
        )
    root = Path(tempfile.mkdtemp(prefix="tokenstate-api-", dir=parent))
    try:
        top = root / PACKAGE
        top.mkdir()
        # Link the top package's files one by one: its mapped subpackages must live inside it.
        for entry in dirs[PACKAGE].iterdir():
            if entry.name != "__pycache__":
                (top / entry.name).symlink_to(entry)
        for name, folder in dirs.items():
            parts = name.split(".")
            if len(parts) != 2:
                continue  # deeper packages live inside their parent's folder already
            link = top / parts[1]
            if link.exists():
                raise RuntimeError(
                    f"{dirs[PACKAGE]} already has an entry {parts[1]!r} that {name} would hide."
                )
            link.symlink_to(folder, target_is_directory=True)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root
