"""tokenstate.runtime — what runs: registry, scheduler, device mirror, kernels, runner, LLM API."""

from tokenstate.runtime.engine import Engine as Engine, EngineConfig as EngineConfig
from tokenstate.runtime.generation_settings import (
    GenerationSettingsWarning as GenerationSettingsWarning,
)
from tokenstate.runtime.llm import LLM as LLM
from tokenstate.runtime.outputs import (
    CompletionOutput as CompletionOutput,
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
from tokenstate.runtime.scheduler import (
    SCHEDULING_ORDERS as SCHEDULING_ORDERS,
    SchedulingOrder as SchedulingOrder,
)
from tokenstate.runtime.workload import Arrival as Arrival, run_workload as run_workload

__all__ = [
    "LLM",
    "ON_UNHONORED",
    "SCHEDULING_ORDERS",
    "Arrival",
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "GenerationSettingsWarning",
    "ModelFactory",
    "OnUnhonored",
    "RequestOutput",
    "SamplingParams",
    "SchedulingOrder",
    "ServableModel",
    "TokenOrigin",
    "factories",
    "register",
    "resolve",
    "run_workload",
    "unregister",
]
