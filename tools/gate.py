"""The token gate: the same requests through the sync path, the async path and the HF oracle.

For each request and path the gate reports ``matched/total`` — the length of the prefix that agrees
with the reference — and, on a divergence, the first diverging output token with the step and batch
row that produced it and whether that row was stale (its input id spliced in on the device). That
is the information that otherwise takes a per-layer trace to find.

References: the async path is compared with the sync path; both are compared with the oracle when
transformers is installed (teacher-forced, see :mod:`tokenstate.tools.oracle`).

By default the gate runs the baseline schedule below and then the schedule matrix
(:mod:`tokenstate.tools.gate_matrix`): one cell per bug family — random row order, preemption and
resume, preemption in flight, slot handover in flight, chunked prefill and budget skips, early
stops and slot reuse, penalties and bad words, n-gram drafts, the fallback path, all at once —
each reporting that its condition was reached. ``quick=True`` runs the
baseline alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from tokenstate.contracts import CHECK_MODES, ConfigError, checks_mode
from tokenstate.runtime.llm import LLM, execution_device
from tokenstate.runtime.outputs import RequestOutput
from tokenstate.runtime.params import SamplingParams
from tokenstate.runtime.registry import ModelFactory
from tokenstate.tools.gate_compare import Divergence, PathResult, compare_tokens
from tokenstate.tools.gate_matrix import (
    CELLS,
    GATE_CPU_STREAM,
    MATRIX_MIN_REQUESTS,
    MATRIX_MIN_TOKENS,
    CellReport,
    MatrixContext,
    run_cell,
)

__all__ = ["Divergence", "GateConfig", "GateReport", "PathResult", "builtin_prompts", "run_gate"]

# Prompt lengths of the built-in request set: single tokens, short prompts, and prompts longer than
# the step budget (chunked prefill) — with more requests than slots, prefills share steps with
# decodes and slots get reused.
_LENGTHS = (1, 5, 70, 3, 17, 41, 9, 2, 33, 96, 12, 6)


MAX_GATE_REQUESTS = 100_000


@dataclass(frozen=True)
class GateConfig:
    """How the gate runs: request count and length, batch shape, seed, device, checks mode."""

    num_requests: int = 8
    max_tokens: int = 32
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 32
    seed: int = 0
    device: str = "cpu"
    checks: str | None = None
    oracle: bool = True
    quick: bool = False  # the baseline schedule only, no schedule matrix
    # max_tokens is a default, not the user's: on a model whose context is too short for it beside
    # prompts longer than a step's budget, the gate runs as many tokens as fit instead of refusing.
    fit_max_tokens: bool = False

    def __post_init__(self) -> None:
        for name in ("num_requests", "max_tokens", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"gate: {name} must be a positive int, got {value!r}.")
        if self.num_requests > MAX_GATE_REQUESTS:  # each runs on three paths: memory and hours
            raise ConfigError(
                f"gate: num_requests must be at most {MAX_GATE_REQUESTS}, got {self.num_requests!r}; "
                "the gate's point is its schedules, which a few dozen requests already reach."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"gate: seed must be an int >= 0, got {self.seed!r}.")
        for name in ("oracle", "quick", "fit_max_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"gate: {name} must be a bool, got {getattr(self, name)!r}.")
        if self.checks is not None and self.checks not in CHECK_MODES:
            raise ConfigError(
                f"gate: checks={self.checks!r} is not a checks mode; valid values: {', '.join(CHECK_MODES)}."
            )
        execution_device(self.device)  # refused here, before any model is built or checked


@dataclass
class GateReport:
    """The gate's result for one model."""

    model: str
    comparisons: list[str]
    requests: list[dict[str, PathResult]] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    prompt_lens: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # path -> the contract error it raised
    oracle_note: str = ""  # why the HF oracle asked for did not run ("": it ran, or was not asked for)
    cells: list[CellReport] = field(default_factory=list)  # the schedule matrix (empty: quick)

    def totals(self) -> dict[str, tuple[int, int]]:
        """``comparison -> (matched, total)`` over all requests."""
        return {
            c: (sum(r[c].matched for r in self.requests), sum(r[c].total for r in self.requests))
            for c in self.comparisons
        }

    def problems(self) -> list[str]:
        """One line per raised path error and per diverging request (first divergence named)."""
        lines = [f"the {path} path raised {error}" for path, error in self.errors.items()]
        for i, row in enumerate(self.requests):
            for comparison, result in row.items():
                if result.divergence is not None:
                    lines.append(
                        f"request {i} ({self.prompt_lens[i]}-token prompt), {comparison}: "
                        f"{result.matched}/{result.total} tokens match; first divergence "
                        f"{result.divergence.describe()}"
                    )
        return lines

    @property
    def baseline_passed(self) -> bool:
        return not self.errors and all(r[c].ok for r in self.requests for c in self.comparisons)

    @property
    def passed(self) -> bool:
        return self.baseline_passed and all(cell.passed for cell in self.cells)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "passed": self.passed,
            "totals": {c: {"matched": m, "total": t} for c, (m, t) in self.totals().items()},
            "stats": self.stats,
            "errors": self.errors,
            "requests": [
                {
                    "request_id": i,
                    "prompt_len": self.prompt_lens[i],
                    **{c: asdict(result) for c, result in r.items()},
                }
                for i, r in enumerate(self.requests)
            ],
            "cells": [cell.to_json() for cell in self.cells],
            "oracle_note": self.oracle_note,
        }


def builtin_prompts(vocab_size: int, max_model_len: int, config: GateConfig) -> list[list[int]]:
    """The deterministic request set: mixed lengths that force chunked prefill and mixed steps.

    Prompts leave each request room for ``max_tokens`` in the context; a ``max_tokens`` that leaves
    no prompt longer than a step's budget (so nothing is prefilled in chunks) is refused, never
    met by shrinking the prompts until the gate tests less than it says."""
    longest = max_model_len - config.max_tokens - 1
    if longest <= config.max_num_batched_tokens:
        raise ConfigError(
            f"gate: max_tokens={config.max_tokens} leaves prompts of at most {max(longest, 0)} tokens in "
            f"the model's context of {max_model_len}, no longer than the step budget "
            f"max_num_batched_tokens={config.max_num_batched_tokens}, so the built-in requests would "
            "never be prefilled in chunks; lower max_tokens to at most "
            f"{max_model_len - config.max_num_batched_tokens - 2} (or pass your own prompts)."
        )
    rng = random.Random(config.seed)
    lengths = [min(_LENGTHS[i % len(_LENGTHS)], longest) for i in range(config.num_requests)]
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]


def _shared_model(llm: LLM) -> ModelFactory:
    """A factory whose every build returns ``llm``'s model: the matrix's engines share its weights.

    Engines run one after the other and each allocates its slots afresh, so sharing is safe, and
    building (or loading) a model is the slow part of a tiny engine.
    """
    model = llm.model
    return dataclasses.replace(
        llm.factory, build=lambda config, *, device, seed: model, presets={"shared": {}}
    )


def run_gate(model: Any, config: GateConfig | None = None, prompts: list[list[int]] | None = None) -> GateReport:
    """Run the gate for one model (a preset/architecture name, a factory, or an HF directory).

    A path whose forward raises — a contract error (a stale read, a placeholder in the embedding,
    naming the rows) or the forward's own (torch's ``IndexError`` when a plain embedding meets a
    placeholder) — is recorded in ``report.errors``, and the gate fails; a ``ConfigError`` (a bad
    prompt or setting) is raised to the caller.
    """
    config = config or GateConfig()
    settings = {
        "device": config.device, "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens, "seed": config.seed,
        "cpu_stream": GATE_CPU_STREAM,
    }  # fmt: skip
    first = LLM(model, async_scheduling=False, **settings)
    shared = _shared_model(first)
    fits = first.model.max_model_len - config.max_num_batched_tokens - 2  # beside a chunked prompt
    if config.fit_max_tokens and 1 <= fits < config.max_tokens:
        config = dataclasses.replace(config, max_tokens=fits)
    params = SamplingParams(max_tokens=config.max_tokens, ignore_eos=True)
    if prompts is None:
        prompts = builtin_prompts(first.model.vocab_size, first.model.max_model_len, config)
    comparisons = ["async vs sync"]
    report = GateReport(model=first.factory.name, comparisons=comparisons, prompt_lens=[len(p) for p in prompts])
    outputs: dict[str, list[RequestOutput]] = {}
    for path in ("sync", "async"):
        engine = first if path == "sync" else LLM(shared, async_scheduling=True, **settings)
        try:
            with checks_mode(config.checks) if config.checks else contextlib.nullcontext():
                outputs[path] = engine.generate(prompts, params)
        except ConfigError:
            raise  # a bad prompt or setting is the caller's, not a divergence of one path
        except Exception as exc:  # a forward's own error (torch's IndexError at a placeholder) fails the path too
            report.errors[path] = f"{type(exc).__name__}: {exc}"
        report.stats[path] = engine.stats.as_dict()
    if report.errors:
        return report
    oracle = None
    if config.oracle:
        from tokenstate.tools.oracle import HFOracle

        try:
            oracle = HFOracle(first.factory, first.model)
        except ConfigError as exc:  # no transformers, no HF save, or no transformers class for it
            report.oracle_note = str(exc).removesuffix(".")
        else:
            report.comparisons = comparisons = [*comparisons, "sync vs oracle", "async vs oracle"]
    for i, prompt in enumerate(prompts):
        sync, async_ = outputs["sync"][i], outputs["async"][i]
        row = {"async vs sync": compare_tokens("async vs sync", sync.token_ids, async_)}
        if oracle is not None:
            for path, out in (("sync", sync), ("async", async_)):
                name = f"{path} vs oracle"
                row[name] = compare_tokens(name, oracle.greedy_choices(prompt, list(out.token_ids)), out)
        report.requests.append(row)
    if not config.quick:
        # The matrix needs enough requests and tokens to reach its conditions whatever the
        # baseline's size; it reuses the baseline's outputs when its request set is the same.
        # ... within the model's context: prompts longer than a step's budget must still fit
        # beside the tokens (a short-context model runs its matrix a little shorter).
        matrix = dataclasses.replace(
            config, num_requests=max(config.num_requests, MATRIX_MIN_REQUESTS),
            max_tokens=max(config.max_tokens, min(MATRIX_MIN_TOKENS, fits)),
        )  # fmt: skip
        matrix_prompts = builtin_prompts(first.model.vocab_size, first.model.max_model_len, matrix)
        if matrix_prompts == prompts and matrix.max_tokens == config.max_tokens:
            baseline = [o.token_ids for o in outputs["sync"]]
        else:
            reference = LLM(shared, async_scheduling=False, **settings)
            matrix_params = SamplingParams(max_tokens=matrix.max_tokens, ignore_eos=True)
            baseline = [o.token_ids for o in reference.generate(matrix_prompts, matrix_params)]
        context = MatrixContext(
            factory=shared, prompts=matrix_prompts, baseline=baseline,
            max_tokens=matrix.max_tokens, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=first.model.max_model_len, seed=config.seed, device=config.device,
            checks=config.checks, oracle=oracle,
        )  # fmt: skip
        report.cells = [run_cell(cell, context) for cell in CELLS]
    return report

