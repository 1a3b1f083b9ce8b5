"""The engine's settings, once: :class:`EngineConfig`, read by the engine, scheduler and runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from tokenstate.runtime.scheduler import SchedulingOrder
from tokenstate.runtime.spec_decode import SpeculativeConfig
from tokenstate.runtime.stream import Chaos, CpuStreamKind

__all__ = ["ON_UNHONORED", "EngineConfig", "OnUnhonored"]

OnUnhonored = Literal["fallback", "refuse"]
ON_UNHONORED: tuple[str, ...] = ("fallback", "refuse")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every engine setting, once (see :class:`~tokenstate.runtime.LLM` for what each means)."""

    async_scheduling: bool = True
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    seed: int = 0
    on_unhonored: OnUnhonored = "fallback"
    scheduling_order: SchedulingOrder = "decode_first"
    kv_cache_tokens: int | None = None
    speculative: SpeculativeConfig | None = None
    chaos: Chaos | None = None
    cpu_stream: CpuStreamKind = "inline"  # on a CPU device: where device work runs (stream.py, process_stream.py)

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculative is None else self.speculative.num_tokens


