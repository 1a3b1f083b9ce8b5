"""What every ``tokenstate`` subcommand shares: ``--module`` imports and the model selection.

``--module PKG`` means the same in ``check``, ``gate`` and ``verify``: import ``PKG`` (so the
factories it registers join the registry) and restrict the command to the models whose forward is
defined in ``PKG`` or that importing ``PKG`` registered (a package may serve a library forward,
e.g. the reference Llama's, under its own architecture). A package that fails to import is a usage
error (exit 2) naming what it raised, never a traceback or a finding. The current directory is
importable, as it is for ``python -m``: a console script does not put it on ``sys.path``, so
``tokenstate check --module myengine`` run next to ``myengine/`` would otherwise not find it.
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


_REGISTERED_BY: dict[str, list[ModelFactory]] = {}  # --module name -> factories its import registered


def import_modules(names: Sequence[str]) -> None:
    """Import every ``--module`` package, with the current directory importable."""
    cwd = os.getcwd()
    if names and cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(
                f"--module {name!r} is not a module name; pass an importable dotted name such as "
                "myengine or myengine.models (run from the directory that holds it)."
            )
        before = set(map(id, registry.factories()))
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
        except SystemExit as exc:
            raise ConfigError(f"--module {name}: importing it called sys.exit({exc.code!r}).") from None
        except Exception as exc:  # the package's own code failed: say so, as a usage error
            raise ConfigError(
                f"--module {name}: importing it raised {type(exc).__name__}: {exc} (python -c "
                f"'import {name}' shows the traceback)."
            ) from exc
        new = [f for f in registry.factories() if id(f) not in before]
        if new:
            _REGISTERED_BY.setdefault(name, []).extend(new)


def forward_module(factory: ModelFactory) -> str:
    """The module that defines a factory's forward (decorators unwrapped)."""
    fn = inspect.unwrap(factory.forward.__wrapped__)
    return getattr(fn, "__module__", "") or ""


def _in_packages(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def factories_in(modules: Sequence[str]) -> list[ModelFactory]:
    """Registered factories whose forward lives in one of ``modules``, or that importing one of them
    registered (all factories when none are named)."""
    registered = {id(f) for name in modules for f in _REGISTERED_BY.get(name, [])}
    found = [
        f for f in registry.factories()
        if not modules or id(f) in registered or _in_packages(forward_module(f), modules)
    ]  # fmt: skip
    if modules and not found:
        raise ConfigError(
            f"no registered forward is defined in {', '.join(modules)}, and importing it registered "
            "no ModelFactory; does the package call tokenstate.runtime.registry.register when "
            "imported? (--model NAME picks a registered model whatever module defines it.)"
        )
    return found


def factory_of_model(model: str) -> ModelFactory:
    """The factory a ``--model`` value names: a preset, an architecture, or an HF directory."""
    path = Path(model)
    if path.is_dir():
        return registry.resolve_directory(path)
    if os.sep in model or "/" in model or model.startswith((".", "~")):
        raise ConfigError(f"--model {model}: no such directory; pass an HF-format directory or a "
                          "registered preset or architecture name.")
    return registry.resolve(model)
