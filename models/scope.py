"""A step scope: the registered forward publishes the step's token ids, a deep embed consumes them.

Real engines rarely pass ``input_ids`` down as an argument: the top-level forward opens a context
(vLLM's forward context, SGLang's forward batch) and a module deep inside reads the ids from it.
:class:`StepScope` is that pattern. The registered forward opens ``with StepScope(inp):``, which
publishes the step's *device* token ids whenever the runner sent them, and :class:`ScopedEmbedding`
— however deep it sits — embeds ``current_scope().embedding_ids()`` through the guarded gather.
The routing checker follows exactly this publish/consume pair.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

import torch
from torch import Tensor, nn

from tokenstate.contracts import ContractViolation, DeviceTokens, ForwardInput, HostTokens
from tokenstate.runtime.kernels import guarded_embedding

__all__ = ["ScopedEmbedding", "StepScope", "current_scope"]



class StepScope:
    """Publishes one step's token ids to the modules that run inside it (a context manager)."""

    __slots__ = ("_device", "_device_tokens", "_host_tokens", "_reset_token")

    def __init__(self, inp: ForwardInput) -> None:
        if not isinstance(inp, ForwardInput):
            raise ContractViolation(
                f"StepScope: expected the step's ForwardInput, got {type(inp).__name__}."
            )
        self._device_tokens: DeviceTokens | None = inp.device_tokens
        self._host_tokens: HostTokens = inp.host_tokens
        self._device: torch.device = inp.device
        self._reset_token: Token[StepScope | None] | None = None

    def __enter__(self) -> StepScope:
        if self._reset_token is not None:
            raise ContractViolation(
                "StepScope: this scope is already open; open one scope per step."
            )
        self._reset_token = _ACTIVE.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reset_token is not None:
            _ACTIVE.reset(self._reset_token)
            self._reset_token = None

    def embedding_ids(self) -> Tensor:
        """``[num_tokens]`` ids to embed: the device ids whenever present, else the fresh host ids.

        The host branch reads ``HostTokens.ids``, which raises ``StaleHostTokensError`` if any
        position is stale — so a placeholder can never be embedded through this scope.
        """
        if self._device_tokens is not None:
            return self._device_tokens.ids
        return self._host_tokens.ids.to(self._device, non_blocking=True)


# Defined after the class: its annotation names StepScope, and beartype's import hook evaluates
# module-level annotations when the assignment runs.
_ACTIVE: ContextVar[StepScope | None] = ContextVar("tokenstate_step_scope", default=None)


def current_scope() -> StepScope:
    """The innermost open :class:`StepScope`; raises if a module runs outside any step."""
    scope = _ACTIVE.get()
    if scope is None:
        raise ContractViolation(
            "no StepScope is open: a scope-consuming module (ScopedEmbedding) ran outside a step. "
            "Call the model through its registered forward, which opens `with StepScope(inp):`."
        )
    return scope


class ScopedEmbedding(nn.Module):
    """A token embedding that takes no ids argument: it embeds the open scope's ids.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: hidden size.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))  # [vocab, hidden]

    def forward(self) -> Tensor:
        ids = current_scope().embedding_ids()  # [num_tokens] int
        return guarded_embedding(ids, self.weight)  # [num_tokens, hidden]
