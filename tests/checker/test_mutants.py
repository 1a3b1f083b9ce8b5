"""Red-before: the zoo verdicts catch a checker that ignores scopes or stops following methods.

Each mutant is a small patch of the real analysis; the zoo comparison must report mismatches under
it (and none under the real checker), so the zoo test above cannot silently pass a broken checker.
"""

from __future__ import annotations

import pytest

from tokenstate.checker.engine import Analyzer
from tokenstate.checker.values import OPAQUE, Bound, Func

SCOPE_CASES = {
    "czoo.scoped_models.contextvar_scope",
    "czoo.scoped_models.contextvar_scope_host",
    "czoo.scoped_models.generator_scope",
    "czoo.scoped_models.thread_local_scope",
    "czoo.scoped_models.class_attribute_scope",
}
METHOD_CASES = {
    "czoo.hierarchy.inherited",
    "czoo.hierarchy.overridden_to_host",
    "czoo.hierarchy.through_super",
    "czoo.llama_like.llama_forward",
    "czoo.llama_like.mistral_forward",
}


def scope_is_a_no_op(self, frame, manager, node):
    return OPAQUE  # enters nothing: what __enter__ / the generator publishes is dropped


def methods_are_opaque(self, frame, member, receiver, node):
    if isinstance(member, Func):
        return Bound(OPAQUE, member.info.qualname)  # a method call becomes an opaque tensor op
    return member


def test_real_checker_matches_every_zoo_verdict(zoo) -> None:
    assert zoo.mismatches(zoo.run()) == {}


@pytest.mark.parametrize(
    ("patched", "mutant", "must_catch"),
    [("enter", scope_is_a_no_op, SCOPE_CASES), ("bind_member", methods_are_opaque, METHOD_CASES)],
    ids=["scope-as-no-op", "stop-following-methods"],
)
def test_zoo_catches_the_mutant(zoo, monkeypatch: pytest.MonkeyPatch, patched: str, mutant, must_catch: set[str]) -> None:
    monkeypatch.setattr(Analyzer, patched, mutant)
    mismatched = zoo.mismatches(zoo.run())
    assert must_catch <= set(mismatched), f"mutant {patched} went unnoticed for {must_catch - set(mismatched)}"
