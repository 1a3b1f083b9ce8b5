"""Whether a registered forward entry point is running now (in this thread or task).

:class:`~tokenstate.contracts.entry_point.EntryPoint` marks its calls; :class:`HostTokens` reads
the mark, so the raw host buffer — placeholders included, input to a combine kernel only — is
refused to a forward on a step with stale positions (an embedding that masks out-of-range ids, as
vLLM's vocabulary-parallel one does, would otherwise turn each placeholder into fluent wrong
tokens without an error).
"""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["forward_running", "running_forward"]

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("tokenstate_forward", default=None)


def running_forward() -> str | None:
    """The name of the registered forward running now, or ``None`` outside every forward."""
    return _RUNNING.get()


class forward_running:  # lower case: read as a function, used only in a with statement
    """``with forward_running(name):`` marks the body as the registered forward ``name`` running.

    A class, not a generator: every step's forward enters it (0.4 µs against 1.2 µs)."""

    __slots__ = ("_name", "_token")

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        self._token = _RUNNING.set(self._name)

    def __exit__(self, *exc: Any) -> None:
        _RUNNING.reset(self._token)
