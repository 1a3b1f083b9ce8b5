"""The runtime half of the cross-check: run one zoo forward through the async engine, declared honouring.

Every zoo forward is registered as *honouring* device ids — the claim the checker judges — and run
through ``LLM(async_scheduling=True)`` on the CPU mirror, where decode steps have spliced rows and
the host buffer holds placeholders. :func:`run_async` says what happened:

* ``"agrees-pass"``: no error, exactly the tokens of the synchronous engine, on the device path
  (no fallback step) — what a forward the checker passes (``honors``/``inert``) must do;
* ``"fails"``: ``StaleHostTokensError``, the guarded embedding refusing a placeholder, or — for the
  raw buffer, which does not raise by itself — a read of ``placeholder_buffer()`` inside the forward
  on a step with stale positions (a test hook, :func:`watch_placeholder_reads`) — what a forward the
  checker flags (``ignores``) must do; the synchronous engine runs it without error first, so the
  failure is the spliced rows'.

The zoo's older cases were written for the checker only (toy modules without the runner's model
interface): :func:`servable` gives each built model the interface the runner needs (vocabulary from
the forward's output width on a fresh probe step, no per-slot state) and seeded weights, without
touching what the checker analyses. The zoo lives in ``tests/checker/zoo``; the zoo's
package is put on ``sys.path`` only while :func:`zoo_on_path` is open.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tokenstate.contracts import (
    BatchLayout,
    ContractViolation,
    ForwardInput,
    HostTokens,
    entry_point,
)

ZOO_ROOT = Path(__file__).resolve().parents[2] / "tests" / "checker" / "zoo"
PROMPTS = [[1, 5, 9, 3], [2, 7], [11, 4, 6, 8, 9, 12]]  # reduced modulo each model's vocabulary
MAX_TOKENS = 5
# Constructor arguments of the older zoo's model classes (the issue-13 ones take a config dict).
_OLD_ARGS: dict[str, tuple[Any, ...]] = {
    "TinyLM": ({"embedder": "guarded", "vocab": 10, "hidden": 4},),
    "Wrapper": ("super",),
    "PositionPooler": (64, 4),
    "ScopedBackbone": (),
    "GlobalBackbone": (),
    "LocalBackbone": (),
    "ClassAttrBackbone": (),
}
_TABLE_ROWS = 10  # embedding rows of the older zoo's models: prompts stay below it

_IN_FORWARD: contextvars.ContextVar[ForwardInput | None] = contextvars.ContextVar("zoo_forward", default=None)


class PlaceholderComputed(Exception):
    """A forward read the raw host buffer on a step whose buffer holds placeholders."""


@contextlib.contextmanager
def zoo_on_path() -> Iterator[None]:
    sys.path.insert(0, str(ZOO_ROOT))
    try:
        yield
    finally:
        sys.path.remove(str(ZOO_ROOT))
        for name in [n for n in sys.modules if n == "czoo" or n.startswith("czoo.")]:
            del sys.modules[name]


@contextlib.contextmanager
def watch_placeholder_reads() -> Iterator[None]:
    original = HostTokens.placeholder_buffer

    def placeholder_buffer(self: HostTokens) -> Tensor:
        if _IN_FORWARD.get() is not None and self.has_stale:  # the runtime's own combine reads it too
            raise PlaceholderComputed(f"the forward read the raw host buffer at stale rows {list(self.stale_rows)}")
        return original(self)

    HostTokens.placeholder_buffer = placeholder_buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        HostTokens.placeholder_buffer = original  # type: ignore[method-assign]


def probe_input() -> ForwardInput:
    """A fresh one-row, two-token prefill step (no device ids), to measure a forward's output width."""
    i32 = torch.int32
    qsl, slots = torch.tensor([0, 2], dtype=i32), torch.tensor([0], dtype=i32)
    host = HostTokens.fresh(torch.tensor([1, 2], dtype=i32), qsl, slots)
    logits = torch.tensor([1])  # [num_logits] int64
    layout = BatchLayout(qsl, torch.tensor([2], dtype=i32), slots, torch.zeros(1, dtype=i32), logits)
    return ForwardInput(host, None, torch.tensor([0, 1]), layout, logits.clone(), slots.long())


def servable(model: Any, forward: Any) -> Any:
    """Give an older zoo model the runner's model interface (see the module docs); no-op otherwise."""
    if hasattr(model, "vocab_size"):
        return model
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for param in model.parameters():  # the toy modules leave weights uninitialised
            param.copy_(torch.randn(param.shape, generator=gen))
    model.max_model_len, model.eos_token_id = 64, None
    model.allocate_slots = lambda num_slots: None
    model.reset_slot = lambda slot: None
    with torch.no_grad():
        model.vocab_size = int(forward.__wrapped__(model, probe_input()).shape[-1])
    return model


def factory_for(module_name: str, forward_name: str, build_at: tuple[str, str] | None) -> Any:
    from tokenstate.runtime import ModelFactory

    forward = getattr(importlib.import_module(module_name), forward_name)
    if build_at is not None:
        built = getattr(importlib.import_module(build_at[0]), build_at[1])
    else:  # what the checker analyses: an instance of the annotated class
        model_class = typing.get_type_hints(forward.__wrapped__)["model"]
        servable_base = importlib.import_module("czoo.servable").ServableLM
        args = ({},) if issubclass(model_class, servable_base) else _OLD_ARGS.get(model_class.__name__, (10, 4))

        def built(config: dict, *, device: Any, seed: int) -> Any:
            return model_class(*args).to(device)

    def build(config: dict, *, device: Any, seed: int) -> Any:
        return servable(built(config, device=device, seed=seed), forward)

    @entry_point(name=f"observed.{module_name}.{forward_name}")
    def observed(model: Any, inp: ForwardInput) -> Tensor:
        token = _IN_FORWARD.set(inp)
        try:
            return forward(model, inp)
        finally:
            _IN_FORWARD.reset(token)

    name = "Zoo" + forward_name.title().replace("_", "")
    return ModelFactory(
        architectures=(name,), forward=observed, build=build, honors_device_token_ids=True,
        presets={name.lower(): {"vocab_size": 10, "hidden_size": 4}},
    )


def generate(factory: Any, *, async_scheduling: bool) -> tuple[list[list[int]], Any]:
    from tokenstate.runtime import LLM, SamplingParams

    llm = LLM(factory, async_scheduling=async_scheduling, max_num_seqs=4)
    vocab = min(llm.model.vocab_size, _TABLE_ROWS)
    prompts = [[t % vocab for t in p] for p in PROMPTS]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return [list(o.token_ids) for o in outputs], llm.stats


def run_async(module_name: str, forward_name: str, build_at: tuple[str, str] | None) -> str:
    """``"agrees-pass"``, ``"fails"`` (see the module docs), or what else happened."""
    factory = factory_for(module_name, forward_name, build_at)
    sync_tokens, _ = generate(factory, async_scheduling=False)
    try:
        async_tokens, stats = generate(factory, async_scheduling=True)
    except (ContractViolation, PlaceholderComputed):
        return "fails"
    if async_tokens != sync_tokens:
        return f"diverges from the synchronous engine: {async_tokens} != {sync_tokens}"
    if not (stats.async_steps > 0 and stats.fallback_steps == 0):
        return f"never took the device path (async_steps={stats.async_steps}, fallback_steps={stats.fallback_steps})"
    return "agrees-pass"
