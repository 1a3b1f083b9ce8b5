"""A package that re-exports its models through nested star imports under TYPE_CHECKING and loads
them lazily at run time, as ``transformers`` does (``from transformers import LlamaForCausalLM``)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import *  # noqa: F403


def __getattr__(name: str):  # the runtime's lazy import (transformers' _LazyModule), flattened
    from .models import deep

    return getattr(deep, name)
