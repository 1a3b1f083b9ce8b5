"""``tokenstate check``: run the routing checker over the model registry.

The checker itself (``tokenstate.checker``) knows nothing of the registry — contracts
never import runtime — so this module turns registered factories into checker targets: each
factory's forward (``ep.__wrapped__``) located by module and qualified name, its declared
``honors_device_token_ids``, and its ``build`` function (which tells the checker the model's class
when the forward's ``model`` parameter is not annotated). The only code executed is the import of
the registry and of the packages named with ``--module``; the forwards are read, never run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Sequence

from tokenstate.checker import (
    CheckerConfig,
    CheckReport,
    EntryResult,
    EntryTarget,
    Verdict,
    check_entry_points,
)
from tokenstate.contracts import ConfigError, ContractDefinitionError, EntryPoint, get_checks_mode
from tokenstate.runtime.cli_support import factories_in, factory_of_model, import_modules
from tokenstate.runtime.registry import ModelFactory

__all__ = ["add_check_arguments", "check_registry", "entry_points_in", "main_check", "run_check", "target_of"]


def _location(fn: object) -> tuple[str, str] | None:
    """``(module, qualname)`` of a plain module-level function (after unwrapping decorators)."""
    fn = inspect.unwrap(fn)  # type: ignore[arg-type]
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not inspect.isfunction(fn) or not module or not qualname or "<locals>" in qualname:
        return None
    return module, qualname


def _source_of(fn: object) -> tuple[str, int]:
    """Where ``fn``'s code stands (a bound method's function's), for a report; ``("?", 0)`` if nowhere."""
    code = getattr(getattr(inspect.unwrap(fn), "__func__", fn), "__code__", None)  # type: ignore[arg-type]
    return (code.co_filename, code.co_firstlineno) if code is not None else ("?", 0)


def target_of(factory: ModelFactory) -> EntryTarget:
    """The checker target of one registered factory."""
    forward = _location(factory.forward.__wrapped__)
    if forward is None:
        raise ContractDefinitionError(
            f"factory {factory.name}: its forward {factory.forward!r} is not a module-level function, "
            "so the routing checker cannot find its source; define the forward at module level."
        )
    build = _location(factory.build)
    return EntryTarget(
        name=factory.name,
        module=forward[0],
        qualname=forward[1],
        declared=factory.honors_device_token_ids,
        model_module=None if build is None else build[0],
        model_qualname=None if build is None else build[1],
    )


def check_registry(
    modules: Sequence[str] = (),
    config: CheckerConfig | None = None,
    *,
    selected: Sequence[ModelFactory] | None = None,
) -> CheckReport:
    """Import ``modules`` (so their factories register), then check the registered factories.

    With ``modules``, only factories whose forward lives in one of those packages are checked; with
    ``selected``, only those factories.
    """
    import_modules(modules)
    if selected is None:
        try:
            chosen = factories_in(modules)
        except ConfigError:  # an engine of its own registers no factory: judge its @entry_point forwards
            targets = entry_points_in(modules)
            if not targets:
                raise ConfigError(
                    f"--module {', '.join(modules)}: no registered forward is defined there, importing it "
                    "registered no ModelFactory, and it defines no module-level @entry_point forward. "
                    "Register a ModelFactory when the package is imported, or decorate your forwards "
                    "with @entry_point (tokenstate.contracts) at module level."
                ) from None
            return check_entry_points(targets, config)
    else:
        chosen = list(selected)
    located: dict[str, EntryTarget] = {}
    unlocated: dict[str, EntryResult] = {}  # reported in its place; the other models still checked
    for factory in chosen:
        try:
            located[factory.name] = target_of(factory)
        except ContractDefinitionError as exc:
            file, line = _source_of(factory.forward.__wrapped__)
            unlocated[factory.name] = EntryResult(
                factory.name, repr(factory.forward), file, line, factory.honors_device_token_ids, Verdict.UNKNOWN,
                error=str(exc),
            )
    checked = check_entry_points(list(located.values()), config).by_entry()
    return CheckReport([unlocated.get(f.name) or checked[f.name] for f in chosen])


def entry_points_in(modules: Sequence[str]) -> list[EntryTarget]:
    """The ``@entry_point`` forwards defined at module level in ``modules`` and their submodules
    (imported here), as checker targets without a declaration: an entry point's input may carry
    device ids, so reading host ids there is a finding whatever registers it."""
    for name in modules:
        package = sys.modules[name]
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), f"{name}."):
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # the package's own code failed: say which module, as a usage error
                raise ConfigError(
                    f"--module {name}: importing its module {info.name} raised {type(exc).__name__}: {exc}; "
                    f"name the modules that define your forwards instead (--module {name}.model)."
                ) from exc
    targets: dict[str, EntryTarget] = {}
    for module_name, module in sorted(sys.modules.items()):
        if not any(module_name == m or module_name.startswith(f"{m}.") for m in modules):
            continue
        for value in list(vars(module).values()):
            located = _location(value.__wrapped__) if isinstance(value, EntryPoint) else None
            if located is not None and located[0] == module_name:  # defined here, not imported
                entry = ".".join(located)
                targets[entry] = EntryTarget(name=entry, module=located[0], qualname=located[1], declared=None)
    return list(targets.values())


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tokenstate check``."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--module", action="append", default=[], metavar="PKG",
        help="import PKG (the current directory is importable) and check only the forwards it "
        "defines; repeatable",
    )
    parser.add_argument(
        "--model", action="append", default=[], metavar="NAME",
        help="check only the forward of this model: a preset (tiny-llama), an architecture, or an "
        "HF-format directory; repeatable (with --module, the package is imported first)",
    )


def run_check(args: argparse.Namespace) -> int:
    """Run ``tokenstate check``: 0 when clean, 1 on findings (errors propagate as TokenStateError)."""
    selected = None
    if args.model:  # the packages first: they register the names --model may use
        import_modules(args.module)
        selected = list(dict.fromkeys(factory_of_model(m) for m in args.model))
    report = check_registry(args.module, selected=selected)
    print(report.to_json() if args.json else report.render())
    return 1 if report.findings else 0


def main_check(argv: list[str]) -> int:
    """``tokenstate check [--json] [--module PKG ...] [--model NAME ...]``: 0 when clean, 1 on findings, 2 on errors."""
    parser = argparse.ArgumentParser(
        prog="tokenstate check",
        description="Statically check that every registered forward embeds device token ids.",
    )
    add_check_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        get_checks_mode()
        return run_check(args)
    except (ConfigError, ContractDefinitionError) as exc:
        print(f"tokenstate check: error: {exc}", file=sys.stderr)
        return 2
