"""Checked forward entry points: beartype for types, jaxtyping for shapes bound across the boundary.

``@entry_point`` wraps a model's forward so that every call is checked at the eager boundary:

* the forward's own annotations (``model: MyModel, inp: ForwardInput -> Float[Tensor, "n v"]``)
  with ``jaxtyped(typechecker=beartype)``, dimensions bound across arguments and the return;
* the step boundary: when an argument is a :class:`~tokenstate.contracts.ForwardInput`, the returned
  logits must be ``[num_logits, vocab]`` on the input's device, with ``num_logits`` bound to the
  input's ``logits_indices`` and ``vocab`` to the model's ``vocab_size`` when it has one.

In ``boundary`` mode the shape/dtype work is done once per *signature* (the tuple of argument types,
shapes, dtypes and devices of the call; a ``ForwardInput`` carries its signature from construction);
repeated calls with a proven signature pay a dictionary lookup and a comparison of the output's
metadata — plus beartype's nominal parameter checks when an annotation looks at values, not only
types (``list[int]``, ``Literal``). ``full`` re-proves every call; ``off``
calls the forward directly. Violations become :class:`~tokenstate.contracts.ContractViolation`
naming the entry point, the argument and the fix.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import torch
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation, BeartypeException
from jaxtyping import AbstractArray, Float, Int, TypeCheckError, jaxtyped

from tokenstate.contracts.checks import get_checks_mode
from tokenstate.contracts.errors import ContractDefinitionError, ContractViolation
from tokenstate.contracts.forward_input import ForwardInput
from tokenstate.contracts.running import forward_running

__all__ = ["EntryPoint", "entry_point"]

_FIX = (
    "Fix: make the forward's arguments and returned logits match its annotations; a registered "
    "forward returns float logits [num_logits, vocab] for inp.logits_indices on inp.device."
)


@jaxtyped(typechecker=beartype)
def _logits_boundary(
    positions: Int[torch.Tensor, " num_tokens"],
    logits_indices: Int[torch.Tensor, " num_logits"],
    logits: Float[torch.Tensor, "num_logits vocab"],
) -> None:
    """Binds num_tokens/num_logits from the input to the returned logits (jaxtyping does the work)."""


def _strip_array_hint(hint: Any) -> Any:
    """``Float[Tensor, "a b"]`` -> ``Tensor`` (also inside unions), for the nominal-only fast path."""
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        return hint.array_type
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strip_array_hint(a) for a in typing.get_args(hint))]  # noqa: UP007
    return hint


_PLAIN, _TENSOR, _INPUT = 0, 1, 2
_kinds: dict[type, int] = {}  # argument type -> how its signature is taken (isinstance on a
# torch.Tensor subclass goes through a metaclass hook; a dict lookup per type is several times cheaper)


def _kind_of(cls: type) -> int:
    kind = _TENSOR if issubclass(cls, torch.Tensor) else _INPUT if issubclass(cls, ForwardInput) else _PLAIN
    _kinds[cls] = kind
    return kind


def _signature_of(value: Any) -> Any:
    """A call argument's (or the output's) checking signature: the metadata a proof depends on."""
    cls = type(value)
    kind = _kinds.get(cls)
    if kind is None:
        kind = _kind_of(cls)
    if kind == _INPUT:
        return value.signature  # computed once, when the step's input was built and validated
    if kind == _TENSOR:
        return (cls, value.shape, value.dtype, value.device)
    return cls


def _call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    key = tuple(map(_signature_of, args))
    if kwargs:
        key += tuple((k, _signature_of(v)) for k, v in sorted(kwargs.items()))
    return key


def _decided_by_type(hint: Any) -> bool:
    """Whether a nominal check of ``hint`` depends on the argument's type alone.

    For such parameters a call whose key matches a proven call (the key holds every argument's
    type) passes the nominal check by construction, so the proven path can skip it. Generics,
    literals and validators (``list[int]``, ``Literal[3]``, ``Annotated[...]``) look at values and
    keep the check.
    """
    if hint is Any or hint is type(None):
        return True
    if isinstance(hint, type):
        return not getattr(hint, "_is_protocol", False) and typing.get_origin(hint) is None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(_decided_by_type(a) for a in typing.get_args(hint))
    return False


class EntryPoint:
    """A forward wrapped by :func:`entry_point`; call it like the forward itself."""

    __slots__ = ("__dict__", "__wrapped__", "_full", "_key_decides_types", "_nominal", "_proven", "name")

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        if not callable(fn) or isinstance(fn, EntryPoint):
            raise ContractDefinitionError(
                f"entry_point: expected a plain forward function, got {fn!r}."
            )
        if not (inspect.isfunction(fn) or inspect.ismethod(fn)):  # its name and annotations are checked
            raise ContractDefinitionError(
                f"entry_point wraps a def (a function or a method); got a {type(fn).__name__} object: "
                "write a def that calls it and decorate that."
            )
        functools.update_wrapper(self, fn)
        self.__wrapped__ = fn
        self.name: str = name or f"{fn.__module__}.{fn.__qualname__}"
        self._full: Callable[..., Any] | None = None
        self._nominal: Callable[..., Any] | None = None
        self._key_decides_types = False
        # call signature -> proven output signature
        self._proven: dict[tuple[Any, ...], Any] = {}

    def _build(self) -> None:
        fn = self.__wrapped__
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise ContractDefinitionError(
                f"entry point {self.name}: its annotations cannot be resolved ({exc}); annotate with "
                "names importable from the forward's module."
            ) from exc
        clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        clone.__kwdefaults__ = fn.__kwdefaults__
        clone.__qualname__ = fn.__qualname__
        clone.__module__ = fn.__module__
        nominal_hints = {k: _strip_array_hint(v) for k, v in hints.items() if k != "return"}
        clone.__annotations__ = nominal_hints
        try:
            self._full = jaxtyped(typechecker=beartype)(fn)
            self._nominal = beartype(clone)
        except BeartypeException as exc:  # a hint beartype cannot check (a plain typing.Protocol...)
            raise ContractDefinitionError(
                f"entry point {self.name}: cannot be checked: {_first_lines(exc)} Annotate with "
                "classes (a typing.Protocol must be @typing.runtime_checkable) or typing.Any."
            ) from exc
        # Parameters whose nominal check the call key already decides (see _decided_by_type); with
        # *args/**kwargs the key cannot tell which parameter an argument binds to, so keep checking.
        code = fn.__code__
        variadic = code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        self._key_decides_types = not variadic and all(
            _decided_by_type(h) for h in nominal_hints.values()
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            if isinstance(value, ForwardInput):  # its raw buffer is refused to every thread from now on
                value.host_tokens._handed_to_forward(self.name)
        with forward_running(self.name):  # HostTokens refuses its raw buffer to a running forward
            return self._call(args, kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mode = get_checks_mode()
        if mode == "off":
            return self.__wrapped__(*args, **kwargs)
        if self._full is None:
            self._build()
        key = _call_key(args, kwargs)
        proven = self._proven.get(key) if mode == "boundary" else None
        if proven is not None and self._key_decides_types:
            # The hot path: same argument types and tensor metadata as a proven call, so the
            # nominal checks hold already; only the output's metadata is compared below.
            out = self.__wrapped__(*args, **kwargs)
        else:
            try:
                if proven is None:
                    out = self._full(*args, **kwargs)  # type: ignore[misc]
                    self._check_step_boundary(args, kwargs, out)
                    if mode == "boundary":
                        self._proven[key] = _signature_of(out)
                    return out
                out = self._nominal(*args, **kwargs)  # type: ignore[misc]
            except (BeartypeCallHintViolation, TypeCheckError) as exc:
                raise ContractViolation(f"entry point {self.name}: {_first_lines(exc)} {_FIX}") from exc
            except BeartypeException as exc:
                raise ContractDefinitionError(f"entry point {self.name}: cannot be checked: {exc}") from exc
        if _signature_of(out) != proven:
            self._check_step_boundary(args, kwargs, out)
        return out

    def _check_step_boundary(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        inp = next((a for a in (*args, *kwargs.values()) if isinstance(a, ForwardInput)), None)
        if inp is None:
            return
        try:
            _logits_boundary(inp.positions, inp.logits_indices, out)
        except (BeartypeCallHintViolation, TypeCheckError) as exc:
            got = f"{type(out).__name__}"
            if isinstance(out, torch.Tensor):
                got = f"{out.dtype} {tuple(out.shape)}"
            raise ContractViolation(
                f"entry point {self.name}: returned logits {got}, expected float "
                f"[num_logits={inp.num_logits}, vocab]. {_FIX}"
            ) from exc
        if out.device != inp.device:
            raise ContractViolation(
                f"entry point {self.name}: returned logits on {out.device}, expected {inp.device}. {_FIX}"
            )
        model = args[0] if args else None
        vocab = getattr(model, "vocab_size", None)
        if isinstance(vocab, int) and out.shape[1] != vocab:
            raise ContractViolation(
                f"entry point {self.name}: returned logits with vocab dim {out.shape[1]}, but the model's "
                f"vocab_size is {vocab}. {_FIX}"
            )

    def __repr__(self) -> str:
        return f"<checked entry point {self.name}>"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Used as a method (``forward = entry_point(...)`` in a class body): bind like a function.
        return self if obj is None else types.MethodType(self, obj)


def _first_lines(exc: BaseException, limit: int = 6) -> str:
    """The checker's own sentence: its first lines, up to jaxtyping's "----" rule (after which it
    dumps every argument of the call, which a one-line error cannot hold whole)."""
    lines = str(exc).strip().splitlines()
    rule = next((i for i, line in enumerate(lines) if line.strip().startswith("-----")), len(lines))
    return " ".join(line.strip() for line in lines[: min(rule, limit)])


def entry_point(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Wrap a forward as a checked entry point (usable as ``@entry_point`` or ``@entry_point(name=...)``)."""
    if fn is None:
        return lambda f: EntryPoint(f, name)
    return EntryPoint(fn, name)
