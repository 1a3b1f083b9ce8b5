"""Whether a registered forward entry point is running now (in this thread or task).

:class:`~tokenstate.contracts.entry_point.EntryPoint` marks its calls; :class:`HostTokens` reads
the mark, so the raw host buffer — placeholders included, input to a combine kernel only — is
refused to a forward on a step with stale positions (an embedding that masks out-of-range ids, as
vLLM's vocabulary-parallel one does, would otherwise turn each placeholder into fluent wrong
tokens without an error).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["forward_running", "running_forward"]

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("tokenstate_forward", default=None)


def running_forward() -> str | None:
    """The name of the registered forward running now, or ``None`` outside every forward."""
    return _RUNNING.get()


@contextlib.contextmanager
def forward_running(name: str) -> Iterator[None]:
    """Mark the body as the registered forward ``name`` running."""
    token = _RUNNING.set(name)
    try:
        yield
    finally:
        _RUNNING.reset(token)
