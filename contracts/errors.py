"""The one exception hierarchy of tokenstate.

Every error raised on purpose by tokenstate derives from :class:`TokenStateError`, so a serving
stack can catch "anything tokenstate refused" in one place. Errors that blame the *caller* (a stale
read, a wrong dtype, a placeholder reaching an embedding) are also ``TypeError`` subclasses, because
that is what a contract violation at a typed boundary is; errors that blame a *contract definition*
(a malformed spec file, a bad registration) are kept apart so they never look like runtime bugs.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ContractDefinitionError",
    "ContractViolation",
    "EmbeddedBadIdsError",
    "StaleHostTokensError",
    "TokenStateError",
]


class TokenStateError(Exception):
    """Root of every error tokenstate raises on purpose.

    Every one pickles whatever its constructor takes (a device process sends them to the host).
    """

    __module__ = "tokenstate.contracts"

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[TokenStateError], args: tuple[object, ...], state: dict[str, object]) -> TokenStateError:
    """Unpickle an error without calling its constructor (keyword-only fields come from ``state``)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ContractViolation(TokenStateError, TypeError):
    """A caller broke a contract: stale read, wrong dtype/shape/device, placeholder in an embedding."""

    __module__ = "tokenstate.contracts"


class StaleHostTokensError(ContractViolation):
    """Host token ids were read at positions whose real ids only exist on the device.

    ``rows`` are batch rows, ``slots`` the requests' persistent slots, ``positions`` the flat token
    positions that hold :data:`~tokenstate.contracts.PLACEHOLDER` on the host.
    """

    __module__ = "tokenstate.contracts"

    def __init__(
        self,
        message: str,
        *,
        rows: tuple[int, ...] = (),
        slots: tuple[int, ...] = (),
        positions: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.rows = rows
        self.slots = slots
        self.positions = positions


class ContractDefinitionError(TokenStateError):
    """A contract itself is malformed: a bad spec file, a bad model registration, a bad mutant."""

    __module__ = "tokenstate.contracts"


class ConfigError(TokenStateError, ValueError):
    """A setting or an input given to tokenstate is invalid (bad mode, bad model config, bad param)."""

    __module__ = "tokenstate.contracts"


class EmbeddedBadIdsError(ContractViolation):
    """A guarded embedding saw ids outside ``[0, vocab)`` (a placeholder, most often).

    Raised at the step's sync point; ``rows``/``slots``/``positions`` locate them, ``ids`` are the
    offending values.
    """

    __module__ = "tokenstate.contracts"

    def __init__(
        self,
        message: str,
        *,
        positions: tuple[int, ...],
        ids: tuple[int, ...],
        rows: tuple[int, ...] = (),
        slots: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.positions = positions
        self.ids = ids
        self.rows = rows
        self.slots = slots
