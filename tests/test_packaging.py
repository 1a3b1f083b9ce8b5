"""The package installs under one import name only, and never imports heavy deps from contracts."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import sysconfig
import tomllib
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"contracts": "tokenstate.contracts", "runtime": "tokenstate.runtime", "models": "tokenstate.models", "tools": "tokenstate.tools", "checker": "tokenstate.checker", "ledger": "tokenstate.ledger"}


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {"tokenstate"}
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert config["package-dir"] == {"tokenstate": "src/tokenstate"} | {v: k for k, v in FOLDERS.items()}


def test_no_bare_imports_of_the_code_folders():
    bad = []
    for path in ROOT.rglob("*.py"):
        if any(part in {".venv", "site", "build"} or part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FOLDERS]
    assert not bad, "import these as tokenstate.*: " + ", ".join(bad)


def test_contracts_import_pulls_in_neither_triton_nor_transformers():
    code = (
        "import sys, tokenstate.contracts; "
        "print(sorted(m for m in ('triton', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_wheel_installs_under_one_name_only(tmp_path):
    """Build the wheel, install it into a clean venv (deps from this env), import, check bare names fail."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("tokenstate-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Dependencies (torch, beartype, ...) come from this environment's site-packages as a plain path
    # entry; its .pth files (our own editable install among them) are not processed from there.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    pathlib.Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    code = """
import importlib
import tokenstate.contracts, tokenstate.runtime, tokenstate.runtime.kernels
for mod in (tokenstate.contracts, tokenstate.runtime):
    assert 'site-packages' in mod.__file__ and '.pth' not in mod.__file__, mod.__file__
for bare in ('contracts', 'runtime', 'models'):
    try:
        importlib.import_module(bare)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit('bare import worked: ' + bare)
print('ok', tokenstate.contracts.__file__)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ") and str(env_dir) in out.stdout
