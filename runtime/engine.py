"""The engine loop, in one place: an :class:`Engine` owns the scheduler and the model runner.

:meth:`Engine.step` reads as the pipeline it is — **schedule → launch → resolve the previous step →
update** — and is the only code that moves tokens between the two: the runner turns a batch into
device work and a resolved step back into arrays; the scheduler turns those arrays into request
state. Nothing else reaches through one into the other.

:class:`EngineConfig` is the one list of engine settings; :class:`~tokenstate.runtime.LLM` builds it
from its arguments, and the scheduler and the runner read it.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenstate.contracts import TokenStateError
from tokenstate.runtime.engine_config import EngineConfig
from tokenstate.runtime.host_memory import retain_freed_memory
from tokenstate.runtime.outputs import EngineStats
from tokenstate.runtime.registry import ModelFactory
from tokenstate.runtime.request import Request
from tokenstate.runtime.runner import InFlight, ModelRunner
from tokenstate.runtime.scheduler import Scheduler
from tokenstate.runtime.watchdog import ProgressWatchdog, default_stall_limit

__all__ = ["Engine", "EngineConfig"]

class Engine:
    """One model's scheduler and runner, and the loop that drives them."""

    def __init__(
        self, factory: ModelFactory, model: Any, config: EngineConfig, stats: EngineStats
    ) -> None:
        self.config = config
        self.stats = stats
        if config.device.type == "cpu":
            retain_freed_memory()  # a step's freed buffers stay for the next (TOKENSTATE_CPU_MALLOC)
        # The runner first: it sizes the slot state against the memory there is, and refuses an
        # oversized max_num_seqs before the scheduler lists that many free slots.
        self.runner = ModelRunner(factory, model, config)
        self.scheduler = Scheduler(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=int(model.max_model_len),
            kv_cache_tokens=config.kv_cache_tokens,
            order=config.scheduling_order,
            seed=config.seed,
            num_speculative_tokens=config.num_speculative_tokens,
            stats=stats,
        )
        self._in_flight: InFlight | None = None
        self._closed = False
        # A hang is a failure: no progress for this many steps raises EngineStalledError.
        self.watchdog = ProgressWatchdog(
            default_stall_limit(int(model.max_model_len), config.max_num_batched_tokens)
        )

    @property
    def has_pending(self) -> bool:
        """Whether a launched step's tokens have not reached the host yet."""
        return self._in_flight is not None

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or self.has_pending

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def step(self) -> list[Request]:
        """Run one step; returns the requests whose finish the host learned in it."""
        finished = self._step()
        self.watchdog.after_step(self.scheduler.unfinished, len(finished))
        return finished

    def _step(self) -> list[Request]:
        with torch.inference_mode():
            batch = self.scheduler.schedule()  # 1. schedule
            if not batch.rows:
                if self._in_flight is None:
                    raise TokenStateError(
                        "engine stalled: requests are unfinished but none can be scheduled and no "
                        "step is in flight (a scheduler invariant broke; please report it)."
                    )
                return self._resolve_previous()
            runner, finished = self.runner, []
            prepared = runner.prepare(batch)
            sync_point = runner.needs_fresh_host_ids(prepared)
            if sync_point:
                # This step runs on host ids, so the host must first learn every pending token.
                finished += self._resolve_previous()
                prepared = runner.refresh(batch, prepared)
            launched = runner.launch(batch, prepared)  # 2. launch
            self._count(fallback=sync_point)
            if not self.config.async_scheduling:
                return finished + self._update(launched)
            finished += self._resolve_previous()  # 3. resolve the previous step, 4. update
            self._in_flight = launched
            return finished

    def _count(self, *, fallback: bool) -> None:
        if not self.config.async_scheduling:
            self.stats.sync_steps += 1
        elif fallback:
            self.stats.fallback_steps += 1
        else:
            self.stats.async_steps += 1

    def _resolve_previous(self) -> list[Request]:
        in_flight, self._in_flight = self._in_flight, None
        return [] if in_flight is None else self._update(in_flight)

    def _update(self, in_flight: InFlight) -> list[Request]:
        """Wait for a step's results, apply them to the requests, tell the host table."""
        resolved = self.runner.resolve(in_flight)
        update = self.scheduler.update(
            in_flight.batch, resolved.tokens, num_sampled=resolved.num_sampled,
            step=in_flight.step, stale=resolved.stale,
        )  # fmt: skip
        self.runner.record(in_flight, resolved, update.record)
        return update.finished

    def close(self) -> None:
        """Drop every request and stop the runner's stream (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.abort()  # waits for the stream's in-flight work first
        except TokenStateError:
            pass  # the stream had already failed (a dead device process): stop it all the same
        finally:
            self.runner.close()

    def abort(self) -> None:
        """Forget every request and the in-flight step (after an error aborted a generate call)."""
        try:
            self.runner.abort()  # a stream that is gone raises here: the requests go all the same
        finally:
            self._in_flight = None
            self.scheduler.abort_all()
            self.watchdog.reset()
