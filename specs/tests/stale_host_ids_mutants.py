"""Mutants of the stale-host-ids spec: each reverts exactly one fix a paid item depends on.

A paid test is re-run under its mutant on every run and must fail there; that is the red-before
evidence, kept executable instead of living in a pull-request body.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F

import tokenstate.contracts.predicate as predicate_module
from tokenstate.contracts import DeviceTokens, ForwardInput, HostTokens
from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "SHI-1/stale-read-allowed",
    doc="HostTokens.ids returns the raw host buffer, placeholders included (the pre-type-state "
    "behaviour: a plain tensor field anyone could embed).",
)
def stale_read_allowed(patch: MutantPatch) -> None:
    patch.setattr(HostTokens, "ids", property(HostTokens.placeholder_buffer))


@mutant(
    "SHI-2/any-stale-blocks-every-row",
    doc="HostTokens.row_ids refuses whenever any position of the batch is stale, so a fresh prefill "
    "row can no longer be read next to a decode row.",
)
def any_stale_blocks_every_row(patch: MutantPatch) -> None:
    original = HostTokens.row_ids

    def row_ids(self: HostTokens, row: int) -> torch.Tensor:
        _ = self.ids  # the whole-batch read refuses as soon as one position is stale
        return original(self, row)

    patch.setattr(HostTokens, "row_ids", row_ids)


@mutant(
    "SHI-3/stale-upload-allowed",
    doc="DeviceTokens.from_host uploads the raw host buffer, so a stale buffer becomes 'authoritative' "
    "device ids with placeholders inside.",
)
def stale_upload_allowed(patch: MutantPatch) -> None:
    def from_host(
        cls: type[DeviceTokens], host: HostTokens, device: torch.device | str, *, vocab_size: int
    ) -> DeviceTokens:
        return cls.from_combine(host.placeholder_buffer().to(device), vocab_size=vocab_size)

    patch.setattr(DeviceTokens, "from_host", classmethod(from_host))


@mutant(
    "SHI-4/stale-input-without-device-ids",
    doc="ForwardInput accepts a step with stale rows and no device tokens (the check at construction "
    "is skipped), so a forward can only reach the placeholders.",
)
def stale_input_without_device_ids(patch: MutantPatch) -> None:
    validate = ForwardInput.__post_init__

    def lenient(self: ForwardInput) -> None:
        if self.device_tokens is None and self.host_tokens.has_stale:
            return
        validate(self)

    patch.setattr(ForwardInput, "__post_init__", lenient)


@mutant(
    "SHI-5/completing-chunk-spliced",
    doc="The row predicate is off by one (a row counts as spliced once seq_len reaches prefill_len), "
    "so the chunk that completes a prefill is wrongly treated as holding a device-sampled token.",
)
def completing_chunk_spliced(patch: MutantPatch) -> None:
    original = predicate_module.spliced_rows

    def off_by_one(seq_lens: torch.Tensor, prefill_lens: torch.Tensor) -> torch.Tensor:
        return original(seq_lens + 1, prefill_lens)

    patch.setattr(predicate_module, "spliced_rows", off_by_one)


@mutant(
    "SHI-9/placeholder-clamped",
    doc="The embedding gather clamps ids into [0, vocab) and flags nothing: a placeholder silently "
    "reads row 0 (the bug shipped as fluent wrong tokens).",
)
def placeholder_clamped(patch: MutantPatch) -> None:
    embedding_module = importlib.import_module("tokenstate.runtime.kernels.embedding")

    def clamping_twin(ids: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = F.embedding(ids.clamp(0, weight.shape[0] - 1), weight)  # [num_tokens, hidden]
        return rows, torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)

    patch.setattr(embedding_module, "guarded_embedding_twin", clamping_twin)


@mutant(
    "SHI-10/twin-predicate-drifts",
    doc="The torch twin of the combine kernel evaluates its own, off-by-one copy of the row predicate "
    "(splicing the chunk that completes a prefill) while the Triton kernel keeps the pinned one.",
)
def twin_predicate_drifts(patch: MutantPatch) -> None:
    # importlib: the package re-exports a *function* named `combine` over the module's name.
    combine_module = importlib.import_module("tokenstate.runtime.kernels.combine")
    original = combine_module.spliced_rows

    def off_by_one(seq_lens: torch.Tensor, prefill_lens: torch.Tensor) -> torch.Tensor:
        return original(seq_lens + 1, prefill_lens)

    patch.setattr(combine_module, "spliced_rows", off_by_one)


@mutant(
    "SHI-6/fallback-keeps-stale-host-ids",
    doc="The fallback step waits for the sampled tokens but is launched on the stale host buffer "
    "instead of the refreshed one, so the non-opting forward still meets the placeholders.",
)
def fallback_keeps_stale_host_ids(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")

    def stale_refresh(prepared: object, table: object, batch: object) -> object:
        return prepared

    patch.setattr(runner_module, "refresh_inputs", stale_refresh)


@mutant(
    "SHI-7/refuse-policy-ignored",
    doc="on_unhonored='refuse' is accepted but never acted on: the runner silently falls back.",
)
def refuse_policy_ignored(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    def never_refuse(self: object, prepared: object) -> None:
        return None

    patch.setattr(ModelRunner, "_refuse_or_fall_back", never_refuse)


@mutant(
    "SHI-8/refuse-without-spliced-rows",
    doc="The runner applies the refuse policy to every async step of a non-opting forward, also to "
    "steps without a spliced row (prefill-only), which are perfectly safe on host ids.",
)
def refuse_without_spliced_rows(patch: MutantPatch) -> None:
    from tokenstate.runtime.runner import ModelRunner

    launch = ModelRunner._launch

    def launch_refusing(
        self: ModelRunner, batch: object, prepared: object, *, use_combine: bool
    ) -> object:
        if self.async_scheduling and not self.factory.honors_device_token_ids:
            self._refuse_or_fall_back(prepared)
        return launch(self, batch, prepared, use_combine=use_combine)

    patch.setattr(ModelRunner, "_launch", launch_refusing)


@mutant(
    "SHI-11/async-branch-cuda-only",
    doc="The engine only takes the asynchronous path on CUDA and silently runs synchronously on a "
    "CPU, so no CPU test reaches the async branch (how the original bugs stayed invisible).",
)
def async_branch_cuda_only(patch: MutantPatch) -> None:
    from tokenstate.runtime import LLM

    init = LLM.__init__

    def cuda_only_init(
        self: LLM,
        model: object,
        *,
        async_scheduling: bool = True,
        device: object = "cpu",
        **kwargs: object,
    ) -> None:
        on_cuda = torch.device(device).type == "cuda"
        init(self, model, async_scheduling=async_scheduling and on_cuda, device=device, **kwargs)

    patch.setattr(LLM, "__init__", cuda_only_init)


@mutant(
    "SHI-12/delegation-blind",
    doc="The routing checker stops re-rooting a callee's embedding routes at the call site, so it "
    "only sees embeddings written in the entry point itself (the per-file view a grep has): "
    "forwards that delegate to a shared block or a scope consumer lose their routes.",
)
def delegation_blind(patch: MutantPatch) -> None:
    from tokenstate.checker.engine import Analyzer

    invoke = Analyzer.invoke

    def invoke_without_callee_routes(self: Analyzer, frame: Any, *args: Any, **kwargs: Any) -> Any:
        before = set(frame.events)
        summary = invoke(self, frame, *args, **kwargs)
        for key in set(frame.events) - before:
            del frame.events[key]
        return summary

    patch.setattr(Analyzer, "invoke", invoke_without_callee_routes)


@mutant(
    "SHI-13/async-splices-wrong-token",
    doc="The async path's combine step splices token 0 instead of each slot's last sampled token: "
    "every id stays inside the vocabulary, so nothing raises and the output is fluent and wrong — "
    "only comparing the paths token by token (the gate) shows it.",
)
def async_splices_wrong_token(patch: MutantPatch) -> None:
    runner_module = importlib.import_module("tokenstate.runtime.runner")
    combine = runner_module.combine

    def combine_with_wrong_last_token(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        args[6] = torch.zeros_like(args[6])  # last_sampled [num_slots]: all token 0
        return combine(*args, **kwargs)

    patch.setattr(runner_module, "combine", combine_with_wrong_last_token)


@mutant(
    "SHI-15/raw-buffer-free-in-forwards",
    doc="`HostTokens.placeholder_buffer()` hands a running forward the raw buffer on a spliced step "
    "(before: only the guarded embedding stood between it and the placeholders).",
)
def raw_buffer_free_in_forwards(patch: MutantPatch) -> None:
    patch.setattr(HostTokens, "placeholder_buffer", lambda self: self._ids)


@mutant(
    "SHI-16/raw-buffer-free-in-worker-threads",
    doc="`HostTokens.placeholder_buffer()` refuses the raw buffer only where the running-forward "
    "context variable is set, which a thread the forward hands work to (a thread pool, "
    "`threading.Thread`) does not inherit.",
)
def raw_buffer_free_in_worker_threads(patch: MutantPatch) -> None:
    from tokenstate.contracts.running import running_forward

    def placeholder_buffer(self: HostTokens) -> torch.Tensor:
        if self._stale_positions and running_forward() is not None:
            self._raise_stale(list(self._stale_positions), f"placeholder_buffer() in forward {running_forward()}")
        return self._ids

    patch.setattr(HostTokens, "placeholder_buffer", placeholder_buffer)
