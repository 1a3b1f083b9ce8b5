"""The token gate: the same requests through the sync path, the async path and the HF oracle.

For each request and path the gate reports ``matched/total`` — the length of the prefix that agrees
with the reference — and, on a divergence, the first diverging output token with the step and batch
row that produced it and whether that row was stale (its input id spliced in on the device). That
is the information that otherwise takes a per-layer trace to find.

References: the async path is compared with the sync path; both are compared with the oracle when
transformers is installed (teacher-forced, see :mod:`tokenstate.runtime.oracle`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tokenstate.contracts import ConfigError, TokenStateError, checks_mode
from tokenstate.runtime.llm import LLM
from tokenstate.runtime.outputs import RequestOutput, TokenOrigin
from tokenstate.runtime.params import SamplingParams

__all__ = ["Divergence", "GateConfig", "GateReport", "PathResult", "builtin_prompts", "run_gate"]

# Prompt lengths of the built-in request set: single tokens, short prompts, and prompts longer than
# the step budget (chunked prefill) — with more requests than slots, prefills share steps with
# decodes and slots get reused.
_LENGTHS = (1, 5, 70, 3, 17, 41, 9, 2, 33, 96, 12, 6)


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

    def __post_init__(self) -> None:
        for name in ("num_requests", "max_tokens", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"gate: {name} must be a positive int, got {value!r}.")


@dataclass(frozen=True)
class Divergence:
    """The first output token where a path leaves its reference."""

    index: int  # output token index within the request
    expected: int
    got: int
    step: int | None  # engine step that sampled the token
    row: int | None  # batch row of the request in that step
    stale: bool | None  # whether that row's last input id was spliced in on the device

    def describe(self) -> str:
        where = "" if self.step is None else f" at step {self.step}, row {self.row} ({'stale' if self.stale else 'fresh'} row)"
        return f"token {self.index}: expected {self.expected}, got {self.got}{where}"


@dataclass(frozen=True)
class PathResult:
    """One request on one comparison, e.g. ``async vs sync``."""

    comparison: str
    matched: int
    total: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.matched == self.total


@dataclass
class GateReport:
    """The gate's result for one model."""

    model: str
    comparisons: list[str]
    requests: list[dict[str, PathResult]] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    prompt_lens: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # path -> the contract error it raised

    def totals(self) -> dict[str, tuple[int, int]]:
        """``comparison -> (matched, total)`` over all requests."""
        return {
            c: (sum(r[c].matched for r in self.requests), sum(r[c].total for r in self.requests))
            for c in self.comparisons
        }

    @property
    def passed(self) -> bool:
        return not self.errors and all(r[c].ok for r in self.requests for c in self.comparisons)

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
        }


def builtin_prompts(vocab_size: int, max_model_len: int, config: GateConfig) -> list[list[int]]:
    """The deterministic request set: mixed lengths that force chunked prefill and mixed steps."""
    rng = random.Random(config.seed)
    longest = max(1, max_model_len - config.max_tokens - 1)
    lengths = [min(_LENGTHS[i % len(_LENGTHS)], longest) for i in range(config.num_requests)]
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]


def _compare(
    comparison: str, reference: Sequence[int], got: RequestOutput, origins: Sequence[TokenOrigin]
) -> PathResult:
    tokens = got.token_ids
    matched = 0
    while matched < min(len(reference), len(tokens)) and reference[matched] == tokens[matched]:
        matched += 1
    total = len(reference)
    if matched == total and len(tokens) == total:
        return PathResult(comparison, matched, total, None)
    if matched >= len(tokens):  # our path stopped early: nothing sampled to blame
        return PathResult(comparison, matched, total, Divergence(matched, reference[matched], -1, None, None, None))
    origin = origins[matched] if matched < len(origins) else None
    divergence = Divergence(
        index=matched,
        expected=reference[matched] if matched < total else -1,
        got=tokens[matched],
        step=None if origin is None else origin.step,
        row=None if origin is None else origin.row,
        stale=None if origin is None else origin.stale,
    )
    return PathResult(comparison, matched, total, divergence)


def run_gate(model: Any, config: GateConfig | None = None, prompts: list[list[int]] | None = None) -> GateReport:
    """Run the gate for one model (a preset/architecture name, a factory, or an HF directory).

    A path whose forward raises a contract error (a stale read, a placeholder in the embedding) is
    recorded in ``report.errors`` — the gate fails, and the error names the rows.
    """
    config = config or GateConfig()
    params = SamplingParams(max_tokens=config.max_tokens, ignore_eos=True)
    engines = {
        path: LLM(
            model,
            async_scheduling=async_scheduling,
            device=config.device,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            seed=config.seed,
        )
        for path, async_scheduling in (("sync", False), ("async", True))
    }
    llm = engines["sync"]
    if prompts is None:
        prompts = builtin_prompts(llm.model.vocab_size, llm.model.max_model_len, config)
    comparisons = ["async vs sync"]
    if config.oracle and _oracle_ready() and llm.factory.save is not None:
        comparisons += ["sync vs oracle", "async vs oracle"]
    report = GateReport(model=llm.factory.name, comparisons=comparisons, prompt_lens=[len(p) for p in prompts])
    outputs: dict[str, list[RequestOutput]] = {}
    for path, engine in engines.items():
        try:
            with checks_mode(config.checks) if config.checks else contextlib.nullcontext():
                outputs[path] = engine.generate(prompts, params)
        except TokenStateError as exc:
            report.errors[path] = f"{type(exc).__name__}: {exc}"
        report.stats[path] = engine.stats.as_dict()
    if report.errors:
        return report
    oracle = None
    if "sync vs oracle" in comparisons:
        from tokenstate.runtime.oracle import HFOracle

        oracle = HFOracle(llm.factory, llm.model)
    for i, prompt in enumerate(prompts):
        sync, async_ = outputs["sync"][i], outputs["async"][i]
        row = {"async vs sync": _compare("async vs sync", sync.token_ids, async_, async_.origins)}
        if oracle is not None:
            for path, out in (("sync", sync), ("async", async_)):
                name = f"{path} vs oracle"
                row[name] = _compare(name, oracle.greedy_choices(prompt, list(out.token_ids)), out, out.origins)
        report.requests.append(row)
    return report


def _oracle_ready() -> bool:
    from tokenstate.runtime.oracle import oracle_available

    return oracle_available()
