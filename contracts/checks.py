"""The checks-mode switch: ``TOKENSTATE_CHECKS=off|boundary|full``.

``boundary`` (the default) validates each type state once where it is created and checks every
registered forward's arguments and returned logits, re-proving the shape/dtype signature only when it
changes. ``full`` re-runs every check on every call. ``off`` calls forwards unchecked. The type
states' own invariants — including id ranges of CPU tensors — are validated in every mode. The environment variable is read once, on first
use; :func:`set_checks_mode` and :func:`checks_mode` override it in-process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Literal, get_args

from tokenstate.contracts.errors import ConfigError

__all__ = ["CHECK_MODES", "ChecksMode", "checks_mode", "get_checks_mode", "set_checks_mode", "validated_setting"]

ChecksMode = Literal["off", "boundary", "full"]
CHECK_MODES: tuple[str, ...] = get_args(ChecksMode)
ENV_VAR = "TOKENSTATE_CHECKS"

_mode: str | None = None


def validated_setting(value: str, source: str, valid: tuple[str, ...], *, what: str, default: str) -> str:
    """``value`` (case and surrounding blanks ignored) if it is one of ``valid``, else a
    :class:`ConfigError` naming ``source``, the valid values and the default.

    The one check every string setting of tokenstate goes through (``TOKENSTATE_CHECKS``,
    ``TOKENSTATE_CPU_GEMM``, ...), so they all read and refuse the same way.
    """
    setting = value.strip().lower()
    if setting not in valid:
        raise ConfigError(
            f"{source}={value!r} is not a {what}; valid values: {', '.join(valid)} (default: {default})."
        )
    return setting


def _validated(value: str, source: str) -> str:
    return validated_setting(value, source, CHECK_MODES, what="checks mode", default="boundary")


def get_checks_mode() -> str:
    """The active checks mode (reads ``TOKENSTATE_CHECKS`` on first use)."""
    global _mode
    if _mode is None:
        _mode = _validated(os.environ.get(ENV_VAR, "boundary"), ENV_VAR)
    return _mode


def set_checks_mode(mode: str | None) -> None:
    """Set the checks mode for this process; ``None`` re-reads ``TOKENSTATE_CHECKS`` on next use."""
    global _mode
    _mode = None if mode is None else _validated(mode, "checks mode")


@contextlib.contextmanager
def checks_mode(mode: str) -> Iterator[None]:
    """Run a block under another checks mode, restoring the previous one afterwards."""
    global _mode
    previous = _mode
    set_checks_mode(mode)
    try:
        yield
    finally:
        _mode = previous
