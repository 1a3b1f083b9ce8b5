"""tokenstate.runtime — what runs: registry, scheduler, device mirror, kernels, runner, LLM API."""

from tokenstate.runtime.registry import (
    ModelFactory as ModelFactory,
    ServableModel as ServableModel,
    factories as factories,
    register as register,
    resolve as resolve,
    unregister as unregister,
)

__all__ = ["ModelFactory", "ServableModel", "factories", "register", "resolve", "unregister"]
