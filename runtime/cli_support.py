"""What every ``tokenstate`` subcommand shares: ``--module`` imports and the model selection.

``--module PKG`` means the same in ``check``, ``gate`` and ``verify``: import ``PKG`` (so the
factories it registers join the registry) and restrict the command to the models whose forward is
defined in ``PKG``. The current directory is importable, as it is for ``python -m``: a console
script does not put it on ``sys.path``, so ``tokenstate check --module myengine`` run next to
``myengine/`` would otherwise not find it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tokenstate.contracts import ConfigError
from tokenstate.runtime import registry
from tokenstate.runtime.registry import ModelFactory

__all__ = ["factories_in", "factory_of_model", "forward_module", "import_modules"]


def import_modules(names: Sequence[str]) -> None:
    """Import every ``--module`` package, with the current directory importable."""
    cwd = os.getcwd()
    if names and cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise ConfigError(f"--module {name}: importing it failed: {exc}.") from exc
            raise ConfigError(
                f"--module {name}: no module named {exc.name!r} in the current directory ({cwd}) or "
                "on sys.path; run from the directory that holds the package, install it "
                "(pip install -e .), or add its parent to PYTHONPATH."
            ) from exc
        except ImportError as exc:
            raise ConfigError(f"--module {name}: importing it failed: {exc}.") from exc


def forward_module(factory: ModelFactory) -> str:
    """The module that defines a factory's forward (decorators unwrapped)."""
    fn = inspect.unwrap(factory.forward.__wrapped__)
    return getattr(fn, "__module__", "") or ""


def _in_packages(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def factories_in(modules: Sequence[str]) -> list[ModelFactory]:
    """Registered factories whose forward lives in one of ``modules`` (all when none are named)."""
    found = [f for f in registry.factories() if not modules or _in_packages(forward_module(f), modules)]
    if modules and not found:
        raise ConfigError(
            f"no registered forward is defined in {', '.join(modules)}; does the package register "
            "its ModelFactory (tokenstate.runtime.registry.register) when imported?"
        )
    return found


def factory_of_model(model: str) -> ModelFactory:
    """The factory a ``--model`` value names: a preset, an architecture, or an HF directory."""
    path = Path(model)
    if path.is_dir():
        return registry.resolve(registry.architecture_of(path))
    if os.sep in model or "/" in model or model.startswith((".", "~")):
        raise ConfigError(f"--model {model}: no such directory; pass an HF-format directory or a "
                          "registered preset or architecture name.")
    return registry.resolve(model)
