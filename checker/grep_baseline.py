"""The file-level grep the routing checker replaces — kept only as a measured baseline.

This is the audit vllm.cpp ran: a file that embeds and never mentions the device-ids field is
flagged. Text matches lie in both directions — a comment mentioning the field passes a file that
embeds host ids, and a file that delegates the embedding (to a scope, a shared block, a helper in
another file) is flagged though it honours the contract — which is what the comparison in the tests
and ``benchmarks/checker_scale.py`` measures.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from tokenstate.checker.report import Verdict

__all__ = ["FLAGGED", "grep_verdict", "misclassified"]

FLAGGED = frozenset({Verdict.IGNORES, Verdict.UNKNOWN})
"""Verdicts that make an entry point a finding (whatever its declaration)."""

_EMBEDS = re.compile(r"embed|Embedding", re.IGNORECASE)
_DEVICE_FIELD = re.compile(r"device_tokens|embedding_ids")


def grep_verdict(path: str | Path) -> Verdict:
    """The baseline's verdict for every forward defined in ``path``."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not _EMBEDS.search(text):
        return Verdict.INERT
    return Verdict.HONORS if _DEVICE_FIELD.search(text) else Verdict.IGNORES


def misclassified(
    predicted: Mapping[str, Verdict], expected: Mapping[str, Verdict]
) -> tuple[list[str], list[str]]:
    """``(false_positives, false_negatives)``: entries flagged that should pass, and the reverse."""
    false_positives = [k for k, v in expected.items() if v not in FLAGGED and predicted[k] in FLAGGED]
    false_negatives = [k for k, v in expected.items() if v in FLAGGED and predicted[k] not in FLAGGED]
    return false_positives, false_negatives
