"""Mutants: named, documented patches that each revert one fix, so a paid test can be re-proved red.

A mutant is declared next to the spec's tests::

    @mutant("SHI-1/stale-read-allowed", doc="HostTokens.ids hands out the raw buffer, placeholders included.")
    def stale_read_allowed(patch: MutantPatch) -> None:
        patch.setattr(HostTokens, "ids", property(HostTokens.placeholder_buffer))

and named by the test that carries the item: ``@pytest.mark.paid("SHI-1", before=stale_read_allowed)``.
The name starts with the item id it belongs to, so a mutant cannot silently serve another item.
Patches only replace attributes that exist (a renamed target makes the mutant fail loudly instead of
patching nothing) and are always undone when the mutant's block ends.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

from tokenstate.contracts.errors import ContractDefinitionError

__all__ = ["Mutant", "MutantPatch", "mutant"]

_NAME = re.compile(r"(?P<item>[A-Z][A-Z0-9]*-[1-9][0-9]*)/[a-z0-9]+(?:-[a-z0-9]+)*")
_ABSENT = object()


class MutantPatch:
    """Records attribute replacements made by one mutant and undoes them in reverse order."""

    def __init__(self, mutant_name: str) -> None:
        self._mutant_name = mutant_name
        self._undo: list[tuple[Any, str, Any]] = []

    @property
    def count(self) -> int:
        return len(self._undo)

    def setattr(self, target: Any, name: str, value: Any) -> None:
        """Replace ``target.name`` (a class or module attribute that must already exist)."""
        if not hasattr(target, name):
            raise ContractDefinitionError(
                f"mutant {self._mutant_name}: {target!r} has no attribute {name!r} to patch; the code it "
                "reverts has moved — update the mutant so it still reverts the fix."
            )
        # Restore exactly what the object itself held: an inherited attribute is deleted again.
        own = (
            vars(target).get(name, _ABSENT)
            if hasattr(target, "__dict__")
            else getattr(target, name)
        )
        misfit = _misfit(inspect.getattr_static(target, name), value)
        if misfit is not None:
            where = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
            raise ContractDefinitionError(
                f"mutant {self._mutant_name}: the replacement of {where}.{name} {misfit}, so a call the code "
                "makes would fail with a TypeError — red for the wrong reason, no evidence of the bug. Give "
                "the replacement the original's parameters (or *args, **kwargs)."
            )
        setattr(target, name, value)
        self._undo.append((target, name, own))

    def undo(self) -> None:
        while self._undo:
            target, name, own = self._undo.pop()
            if own is _ABSENT:
                delattr(target, name)
            else:
                setattr(target, name, own)


def _misfit(original: Any, replacement: Any) -> str | None:
    """Why ``replacement`` cannot take every call ``original`` takes, where both are plain functions
    (or both the same kind of static or class method); ``None`` when it can, or cannot be told."""
    wrappers = (staticmethod, classmethod)
    if isinstance(original, wrappers) or isinstance(replacement, wrappers):
        if type(original) is not type(replacement):
            return None
        original, replacement = original.__func__, replacement.__func__
    if not (inspect.isfunction(original) and inspect.isfunction(replacement)):
        return None
    old = inspect.signature(original).parameters.values()
    new = inspect.signature(replacement).parameters.values()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    old_positional = [p for p in old if p.kind in positional]
    new_positional = [p for p in new if p.kind in positional]
    old_kinds = {p.kind for p in old}
    new_kinds = {p.kind for p in new}
    if inspect.Parameter.VAR_POSITIONAL not in new_kinds:
        if inspect.Parameter.VAR_POSITIONAL in old_kinds:
            return "takes no *args where the original does"
        if len(new_positional) < len(old_positional):
            return f"takes {len(new_positional)} positional arguments where the original takes {len(old_positional)}"
    for index, param in enumerate(new_positional):
        if param.default is not param.empty:
            continue
        if index >= len(old_positional):
            return f"needs {param.name!r}, which the original does not take"
        if old_positional[index].default is not param.empty:
            return f"needs {param.name!r}, which the original does not need"
    old_named = {p.name: p for p in old if p.kind is inspect.Parameter.KEYWORD_ONLY}
    new_named = {p.name: p for p in new if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    takes_any_keyword = inspect.Parameter.VAR_KEYWORD in new_kinds
    if inspect.Parameter.VAR_KEYWORD in old_kinds and not takes_any_keyword:
        return "takes no **kwargs where the original does"
    for keyword in old_named:
        if keyword not in new_named and not takes_any_keyword:
            return f"takes no keyword {keyword!r}"
    for param in new:
        if param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is param.empty:
            if param.name not in old_named:
                return f"needs {param.name!r}, which the original does not take"
            if old_named[param.name].default is not param.empty:
                return f"needs {param.name!r}, which the original does not need"
    return None


class Mutant:
    """A named patch that reverts one fix; :meth:`applied` is the block in which the bug is back."""

    __slots__ = ("_apply", "doc", "item_id", "name")

    def __init__(self, name: str, doc: str, apply: Callable[[MutantPatch], None]) -> None:
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            raise ContractDefinitionError(
                f"mutant name {name!r} must be '<ITEM-ID>/<kebab-case-bug>', e.g. 'SHI-1/stale-read-allowed'."
            )
        if not isinstance(doc, str) or not doc.strip():
            raise ContractDefinitionError(
                f"mutant {name}: doc= must say which fix it reverts and how."
            )
        if not callable(apply):
            raise ContractDefinitionError(
                f"mutant {name}: decorate a function taking a MutantPatch."
            )
        self.name = name
        self.item_id = match.group("item")
        self.doc = " ".join(doc.split())
        self._apply = apply

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Apply the patch for the duration of the block (errors while applying name the mutant)."""
        patch = MutantPatch(self.name)
        try:
            try:
                self._apply(patch)
            except ContractDefinitionError:
                raise
            except Exception as exc:
                raise ContractDefinitionError(
                    f"mutant {self.name} could not be applied: {exc!r}"
                ) from exc
            if patch.count == 0:
                raise ContractDefinitionError(
                    f"mutant {self.name} patched nothing; a mutant must revert its fix via patch.setattr."
                )
            yield
        finally:
            patch.undo()

    def __repr__(self) -> str:
        return f"<mutant {self.name}>"


def mutant(name: str, *, doc: str) -> Callable[[Callable[[MutantPatch], None]], Mutant]:
    """Declare a mutant: ``@mutant("SHI-1/stale-read-allowed", doc=...)`` over ``def f(patch): ...``."""

    def declare(apply: Callable[[MutantPatch], None]) -> Mutant:
        return Mutant(name, doc, apply)

    return declare
