"""tokenstate.runtime — what runs: registry, scheduler, device mirror, kernels, runner, LLM API."""

from tokenstate.runtime.llm import LLM as LLM
from tokenstate.runtime.outputs import (
    EngineStats as EngineStats,
    FinishReason as FinishReason,
    RequestOutput as RequestOutput,
    TokenOrigin as TokenOrigin,
)
from tokenstate.runtime.params import SamplingParams as SamplingParams
from tokenstate.runtime.registry import (
    ModelFactory as ModelFactory,
    ServableModel as ServableModel,
    factories as factories,
    register as register,
    resolve as resolve,
    unregister as unregister,
)
from tokenstate.runtime.runner import ON_UNHONORED as ON_UNHONORED, OnUnhonored as OnUnhonored

__all__ = [
    "LLM",
    "ON_UNHONORED",
    "EngineStats",
    "FinishReason",
    "ModelFactory",
    "OnUnhonored",
    "RequestOutput",
    "SamplingParams",
    "ServableModel",
    "TokenOrigin",
    "factories",
    "register",
    "resolve",
    "unregister",
]
