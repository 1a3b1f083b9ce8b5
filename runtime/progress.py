"""Step observers: who wants to hear, after each engine step, which requests finished in it.

The CLI's progress bar counts generated tokens through this (a bar that counts models sits at 0 %
for the whole run of a one-model gate). Observers are per context (``contextvars``), so an engine
driven in another thread or task never reports into someone else's bar.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence

from tokenstate.runtime.outputs import RequestOutput

__all__ = ["StepObserver", "notify_step", "observe_steps"]

StepObserver = Callable[[Sequence[RequestOutput]], None]

_observers: contextvars.ContextVar[tuple[StepObserver, ...]] = contextvars.ContextVar(
    "tokenstate_step_observers", default=()
)


@contextlib.contextmanager
def observe_steps(observer: StepObserver) -> Iterator[None]:
    """Call ``observer(finished)`` after every engine step run inside the block."""
    token = _observers.set((*_observers.get(), observer))
    try:
        yield
    finally:
        _observers.reset(token)


def notify_step(finished: Sequence[RequestOutput]) -> None:
    """Tell the observers of the current context that a step finished ``finished``."""
    for observer in _observers.get():
        observer(finished)
