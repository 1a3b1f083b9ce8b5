"""The gate's schedule matrix: one schedule per family of async-engine bugs, each proving it fired.

One gentle schedule leaves most bug families asleep: a batch that is never reordered cannot show a
row-order bug, a KV cache that never fills cannot show a resume bug. Each cell below provokes one
family on purpose, runs the same requests through a synchronous and an asynchronous engine (and
scores greedy cells against the HF oracle), audits the engine's per-slot bookkeeping after every
step (:mod:`tokenstate.tools.step_audit`), and reports the counters that show its condition was
actually reached — a cell whose condition did not fire fails, since it tested nothing.

Requests arrive over time (two at once, then one every other step), so requests join batches they
were absent from. Stop ids and bad words are taken from the baseline schedule's synchronous output,
so they are tokens the model really produces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenstate.contracts import checks_mode
from tokenstate.runtime.llm import LLM
from tokenstate.runtime.outputs import RequestOutput
from tokenstate.runtime.params import SamplingParams
from tokenstate.runtime.registry import ModelFactory
from tokenstate.runtime.workload import Arrival, run_workload
from tokenstate.tools.gate_compare import PathResult, compare_tokens
from tokenstate.tools.step_audit import audit_engine

GATE_CPU_STREAM = "thread"
"""The gate runs every engine on the threaded CPU stream, not the inline default: there the device
work of step N really runs while the host prepares step N+1, so an ordering fault can show."""

__all__ = [
    "CELLS",
    "MATRIX_MIN_REQUESTS",
    "MATRIX_MIN_TOKENS",
    "CellReport",
    "Condition",
    "MatrixContext",
    "ScheduleCell",
    "run_cell",
]

MATRIX_MIN_REQUESTS = 8
"""The matrix runs at least this many requests (more than the slots: slots get reused)."""
MATRIX_MIN_TOKENS = 32
"""... and generates at least this many tokens in its longest cells (loops, so drafts get accepted),
or as many as the model's context leaves beside a prompt longer than the step budget."""


@dataclass(frozen=True)
class Condition:
    """A counter a cell needs to reach, and what it reached (``value`` from the named path)."""

    name: str
    value: int
    needed: str  # "> 0" or "= 0"

    @property
    def reached(self) -> bool:
        return self.value > 0 if self.needed == "> 0" else self.value == 0

    def describe(self) -> str:
        return f"{self.name} = {self.value}"


@dataclass(frozen=True)
class MatrixContext:
    """What every cell builds on: the model, the baseline's prompts and sync outputs, the limits."""

    factory: ModelFactory  # builds the shared model (every engine reuses one set of weights)
    prompts: list[list[int]]
    baseline: list[tuple[int, ...]]  # the baseline schedule's sync output per prompt
    max_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    seed: int
    device: str
    checks: str | None
    oracle: Any | None  # an HFOracle, or None


@dataclass(frozen=True)
class CellPlan:
    """One cell's requests and engine settings."""

    params: list[SamplingParams]
    engine: dict[str, Any]
    oracle: bool  # every request is plain greedy: HF's greedy choices are the reference
    prompts: list[list[int]] | None = None  # None: the baseline's prompts
    # Races that need a rare interleaving: run again with the next seed (up to this many runs)
    # until every condition is reached; the report says how many runs it took.
    attempts: int = 1


@dataclass(frozen=True)
class ScheduleCell:
    """A named schedule, the family it provokes, and the conditions that prove it did."""

    name: str
    provokes: str
    plan: Callable[[MatrixContext], CellPlan]
    conditions: Callable[[MatrixContext, CellPlan, dict[str, Any]], list[Condition]]
    needs_speculative: bool = False


@dataclass
class CellReport:
    """One cell's result for one model."""

    name: str
    provokes: str
    comparisons: list[str] = field(default_factory=list)
    requests: list[dict[str, PathResult]] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: str = ""  # why the cell did not run (the model lacks the feature); empty: it ran
    seconds: float = 0.0

    def totals(self) -> dict[str, tuple[int, int]]:
        return {
            c: (sum(r[c].matched for r in self.requests), sum(r[c].total for r in self.requests))
            for c in self.comparisons
        }

    @property
    def passed(self) -> bool:
        if self.skipped:
            return True
        return (
            not self.errors
            and all(r[c].ok for r in self.requests for c in self.comparisons)
            and all(c.reached for c in self.conditions)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.name,
            "provokes": self.provokes,
            "passed": self.passed,
            "skipped": self.skipped,
            "totals": {c: {"matched": m, "total": t} for c, (m, t) in self.totals().items()},
            "conditions": [
                {"name": c.name, "value": c.value, "needed": c.needed, "reached": c.reached}
                for c in self.conditions
            ],
            "stats": self.stats,
            "errors": self.errors,
            "divergences": [
                {"request_id": i, "comparison": c, "detail": r.divergence.describe()}
                for i, row in enumerate(self.requests)
                for c, r in row.items()
                if r.divergence is not None
            ],
            "seconds": round(self.seconds, 2),
        }


# -- the cells ---------------------------------------------------------------------------------


def _tokens(ctx: MatrixContext) -> int:
    return max(4, ctx.max_tokens // 2)


def _greedy(ctx: MatrixContext, engine: dict[str, Any]) -> CellPlan:
    params = SamplingParams(max_tokens=_tokens(ctx), ignore_eos=True)
    return CellPlan([params] * len(ctx.prompts), engine, oracle=True)


def _longest_request(ctx: MatrixContext, tokens: int) -> int:
    return max(min(len(p) + tokens, ctx.max_model_len) for p in ctx.prompts)


def _stop_params(ctx: MatrixContext) -> list[SamplingParams]:
    """Varied lengths; every other request stops on a token its baseline output really holds."""
    tokens = _tokens(ctx)
    params = []
    for i, base in enumerate(ctx.baseline):
        limit = max(1, tokens - (5 * i) % tokens)
        stop = (base[min(2 + i % 4, len(base) - 1)],) if i % 2 == 0 and base else ()
        params.append(SamplingParams(max_tokens=limit, stop_token_ids=stop, ignore_eos=False))
    return params


def _early_stops(ctx: MatrixContext) -> CellPlan:
    return CellPlan(_stop_params(ctx), {"max_num_seqs": max(1, ctx.max_num_seqs - 1)}, oracle=True)


def _history_params(ctx: MatrixContext) -> list[SamplingParams]:
    """Penalties, seeded sampling with filters, and bad words taken from the baseline output."""
    tokens = _tokens(ctx)
    params = []
    for i, base in enumerate(ctx.baseline):
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(max_tokens=tokens, repetition_penalty=1.4, ignore_eos=True))
        elif kind == 1:
            params.append(SamplingParams(
                max_tokens=tokens, presence_penalty=0.8, frequency_penalty=0.5, ignore_eos=True
            ))  # fmt: skip
        elif kind == 2:
            words = ((base[1],),) if len(base) > 1 else ()
            params.append(SamplingParams(
                max_tokens=tokens, temperature=0.8, top_k=20, top_p=0.9, seed=i, bad_words=words,
                frequency_penalty=0.3, ignore_eos=True,
            ))  # fmt: skip
        else:  # a two-token word the greedy output really contains: the newest token is its prefix
            words = ((base[2], base[3]),) if len(base) > 3 else ()
            params.append(SamplingParams(max_tokens=tokens, bad_words=words, ignore_eos=True))
    return params


def _history_readers(ctx: MatrixContext) -> CellPlan:
    # Random order too: per-request sampling state and penalties must be read by slot, not row.
    return CellPlan(_history_params(ctx), {"scheduling_order": "random", "seed": ctx.seed + 5}, oracle=False)


def _history_readers_device_first(ctx: MatrixContext) -> CellPlan:
    # Inline, a step's device work runs as it is submitted, before the host resolves the step
    # before it: a history reader that looks at the host's table then always misses the newest
    # token. On the threaded stream the host usually records that token first, and the bug hides.
    plan = _history_readers(ctx)
    return dataclasses.replace(plan, engine={**plan.engine, "cpu_stream": "inline"})


def _spec_engine() -> dict[str, Any]:
    return {"speculative": {"method": "ngram", "num_tokens": 3}}


def _draft_prompts(ctx: MatrixContext) -> list[list[int]]:
    """Every other prompt repeats one token: models then tend to loop, so some drafts get accepted
    (on random prompts a tiny model's n-gram drafts are almost never right, and the cell must see
    drafts both accepted and rejected)."""
    repeat = min(24, ctx.max_model_len - ctx.max_tokens - 1)
    return [p if i % 2 == 0 else [p[0]] * repeat for i, p in enumerate(ctx.prompts)]


def _drafts(ctx: MatrixContext) -> CellPlan:
    # On the deferred stream, the latest a device may run: a slot's reset, a rollback, a draft
    # write all run only when the host waits on the step after planning the next ones, so host
    # bookkeeping a stream task touches behind the host's back breaks on every run (on the threaded
    # stream the worker almost always catches up first, and the bug hides).
    params = SamplingParams(max_tokens=ctx.max_tokens, ignore_eos=True)  # long: loops take a while
    engine = {**_spec_engine(), "cpu_stream": "deferred"}
    return CellPlan([params] * len(ctx.prompts), engine, oracle=True, prompts=_draft_prompts(ctx))


def _everything(ctx: MatrixContext) -> CellPlan:
    tokens = _tokens(ctx)
    engine: dict[str, Any] = {
        "scheduling_order": "random",
        "seed": ctx.seed + 2,
        "kv_cache_tokens": _longest_request(ctx, tokens),
        "max_num_batched_tokens": max(2, ctx.max_num_batched_tokens // 3),
    }
    if not ctx.factory.supports_speculative:
        return CellPlan(_stop_params(ctx), engine, oracle=True)
    engine.update(_spec_engine())
    return CellPlan(_stop_params(ctx), engine, oracle=True, prompts=_draft_prompts(ctx))


def _fallback(ctx: MatrixContext) -> CellPlan:
    engine: dict[str, Any] = {"honors_device_token_ids": False, "scheduling_order": "random", "seed": ctx.seed + 4}
    if not ctx.factory.supports_speculative:
        return _greedy(ctx, engine)
    engine.update(_spec_engine())
    params = SamplingParams(max_tokens=ctx.max_tokens, ignore_eos=True)
    return CellPlan([params] * len(ctx.prompts), engine, oracle=True, prompts=_draft_prompts(ctx))


def _fallback_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    names = ["fallback_steps"] + (["drafts_accepted", "drafts_rejected"] if "speculative" in plan.engine else [])
    return _counter(*names)(ctx, plan, result)


def _in_flight(ctx: MatrixContext) -> CellPlan:
    """Preemptions that race a step in flight: more requests than the baseline, arriving one per
    step, a KV budget of the longest request, random order; drafts too where the model has them."""
    prompts = _draft_prompts(ctx) if ctx.factory.supports_speculative else list(ctx.prompts)
    prompts += [list(reversed(p)) for p in prompts[: len(prompts) // 2]]
    tokens = _tokens(ctx)
    engine: dict[str, Any] = {
        "scheduling_order": "random", "seed": ctx.seed + 5,
        "kv_cache_tokens": max(min(len(p) + tokens, ctx.max_model_len) for p in prompts),
    }  # fmt: skip
    if ctx.factory.supports_speculative:
        engine.update(_spec_engine())
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return CellPlan([params] * len(prompts), engine, oracle=True, prompts=prompts, attempts=6)


def _in_flight_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    # Reported in the stats only: slots_handed_over_in_flight and readmissions_held_in_flight (which
    # this schedule reaches on some models only); the "slot handover in flight" cell requires both.
    names = ["preempted_in_flight"]
    if "speculative" in plan.engine:
        names.append("preempted_awaiting_drafts")
    return _counter(*names)(ctx, plan, result)


# The slot-handover schedule, found by replaying the scheduler alone: with plain greedy requests
# that ignore EOS, which rows run is independent of the tokens, so it reaches its window the same
# way on every model. Its own small sizes (not the gate's): the window needs a KV budget only a few
# tokens above the longest request, a token budget that admits a waiting request on a few free KV
# tokens, and four slots, so that an older waiting request takes the slot a preempted younger one
# just freed.
_HANDOVER_PROMPT_LENS = (4, 2, 4, 2, 6, 12)
_HANDOVER_TOKENS = 12


def _handover(ctx: MatrixContext) -> CellPlan:
    """A slot handed over while its previous owner's token is in flight (ASY-8's window), and a
    preempted request held back until its in-flight token resolved (ASY-16's)."""
    # The baseline's token ids, cut to this cell's lengths.
    pool = [t for p in ctx.prompts for t in p]
    room = max(1, ctx.max_model_len - _HANDOVER_TOKENS - 1)
    lens = [min(n, room) for n in _HANDOVER_PROMPT_LENS]
    starts = [sum(lens[:i]) for i in range(len(lens))]
    prompts = [[pool[(s + j) % len(pool)] for j in range(n)] for s, n in zip(starts, lens, strict=True)]
    engine: dict[str, Any] = {
        "scheduling_order": "random", "seed": ctx.seed + 6, "max_num_seqs": 4,
        "max_num_batched_tokens": 16, "kv_cache_tokens": max(lens) + _HANDOVER_TOKENS + 2,
    }  # fmt: skip
    params = SamplingParams(max_tokens=_HANDOVER_TOKENS, ignore_eos=True)
    return CellPlan([params] * len(prompts), engine, oracle=True, prompts=prompts, attempts=4)


def _stat(result: dict[str, Any], path: str, name: str) -> int:
    return int(result["stats"][path].get(name, 0))


def _bad_word_violations(params: Sequence[SamplingParams], prompts: Sequence[Sequence[int]],
                         outputs: Sequence[RequestOutput]) -> int:  # fmt: skip
    """Generated tokens that complete one of their request's bad words."""
    count = 0
    for p, prompt, out in zip(params, prompts, outputs, strict=True):
        seq = [*prompt, *out.token_ids]
        for j in range(len(prompt), len(seq)):
            for word in p.bad_words:
                n = len(word)
                if j - n + 1 >= 0 and tuple(seq[j - n + 1 : j + 1]) == word:
                    count += 1
    return count


def _history_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    outputs = result["outputs"]
    changed = sum(out.token_ids != base[: len(out.token_ids)] for out, base in zip(outputs["async"], ctx.baseline, strict=True))
    return [
        Condition("requests changed by penalties/bad words", changed, "> 0"),
        Condition("bad words generated (async)", _bad_word_violations(plan.params, ctx.prompts, outputs["async"]), "= 0"),
        Condition("bad words generated (sync)", _bad_word_violations(plan.params, ctx.prompts, outputs["sync"]), "= 0"),
    ]  # fmt: skip


def _stop_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    stops = sum(out.finish_reason == "stop" for out in result["outputs"]["async"])
    return [
        Condition("requests stopped early", stops, "> 0"),
        Condition("discarded tokens", _stat(result, "async", "discarded_tokens"), "> 0"),
        Condition("slot reuses", _stat(result, "async", "slot_reuses"), "> 0"),
    ]


def _counter(*names: str) -> Callable[[MatrixContext, CellPlan, dict[str, Any]], list[Condition]]:
    def conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
        return [Condition(name.replace("_", " "), _stat(result, "async", name), "> 0") for name in names]

    return conditions


def _chunked(ctx: MatrixContext) -> CellPlan:
    # Random order lets a prefill chunk take the budget decode rows wanted: they are skipped. Drafts
    # let decode rows take the whole budget before a running prefill: its chunk is skipped (without
    # them, admission needs budget left after the decodes, so a prefill never meets a full step).
    engine: dict[str, Any] = {
        "max_num_batched_tokens": max(2, ctx.max_num_batched_tokens // 4),
        "scheduling_order": "random", "seed": ctx.seed + 3,
    }  # fmt: skip
    if not ctx.factory.supports_speculative:
        return _greedy(ctx, engine)
    engine.update(_spec_engine())
    return dataclasses.replace(_greedy(ctx, engine), prompts=_draft_prompts(ctx))


def _chunk_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    budget = plan.engine["max_num_batched_tokens"]
    prompts = plan.prompts if plan.prompts is not None else ctx.prompts
    conditions = [
        Condition("prompts prefilled in chunks", sum(len(p) > budget for p in prompts), "> 0"),
        Condition("skipped rows", _stat(result, "async", "skipped_rows"), "> 0"),
    ]
    if "speculative" in plan.engine:  # only drafts bring a step a prefill chunk cannot enter
        # A skipped prefill chunk: its request must resume exactly where the last chunk ended.
        conditions.append(Condition("skipped prefill rows", _stat(result, "async", "skipped_prefill_rows"), "> 0"))
    return conditions


def _everything_conditions(ctx: MatrixContext, plan: CellPlan, result: dict[str, Any]) -> list[Condition]:
    names = ["preemptions", "reordered_steps", "skipped_rows"]
    if "speculative" in plan.engine:
        names.append("drafts_rejected")  # with a preemption, a rollback, a reused slot nearby
    return _counter(*names)(ctx, plan, result)


CELLS: tuple[ScheduleCell, ...] = (
    ScheduleCell(
        "random row order", "row-order assumptions: rows permuted every step",
        lambda ctx: _greedy(ctx, {"scheduling_order": "random", "seed": ctx.seed + 1}),
        _counter("reordered_steps"),
    ),
    ScheduleCell(
        "preemption + resume", "a small KV budget: requests preempted in flight, resumed by recompute",
        lambda ctx: _greedy(ctx, {"kv_cache_tokens": _longest_request(ctx, _tokens(ctx)) + 4}),
        _counter("preemptions"),
    ),
    ScheduleCell(
        "chunked prefill + budget skips", "a small token budget: prompts in chunks, running rows skipped",
        _chunked, _chunk_conditions,
    ),
    ScheduleCell(
        "preemption in flight", "preemptions racing a step in flight: a token or drafts resolve after "
        "their request lost its slot, and after the slot got a new owner",
        _in_flight, _in_flight_conditions,
    ),
    ScheduleCell(
        "slot handover in flight", "a preempted request's token still in flight while an older "
        "waiting request takes its slot, and while the request itself waits to be re-admitted",
        _handover, _counter("preempted_in_flight", "slots_handed_over_in_flight", "readmissions_held_in_flight"),
    ),
    ScheduleCell(
        "early stops + slot reuse", "stop ids and short limits: finished requests' in-flight rows, reused slots",
        _early_stops, _stop_conditions,
    ),
    ScheduleCell(
        "penalties + bad words", "history readers: penalties, bad words, seeded sampling read the history",
        _history_readers, _history_conditions,
    ),
    ScheduleCell(
        "penalties + bad words, device first", "the history readers with every step's device work run "
        "as it is submitted (inline stream), before the host learns the previous step's token",
        _history_readers_device_first, _history_conditions,
    ),
    ScheduleCell(
        "n-gram drafts", "speculative decoding: draft positions spliced, accepted and rejected",
        _drafts, _counter("drafts_accepted", "drafts_rejected"), needs_speculative=True,
    ),
    ScheduleCell(
        "fallback path", "the same model declared as not honouring device ids: every async step with "
        "spliced rows runs on fresh host ids, drafts included",
        _fallback, _fallback_conditions,
    ),
    ScheduleCell(
        "all at once", "random order, preemption, small budget, stops and drafts together",
        _everything, _everything_conditions,
    ),
)  # fmt: skip
"""The matrix, in the order the gate runs and reports it."""


def _arrivals(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[Arrival]:
    """Two requests at once, then one every other step: each joins a batch it was absent from."""
    return [
        Arrival(0 if i < 2 else 2 * (i - 1), tuple(p), s)
        for i, (p, s) in enumerate(zip(prompts, params, strict=True))
    ]


def _fresh_slots(
    factory: ModelFactory, ctx: MatrixContext, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
) -> list[RequestOutput]:
    budget = sum(len(p) for p in prompts) + len(prompts)
    llm = LLM(factory, async_scheduling=False, device=ctx.device, max_num_seqs=len(prompts),
              max_num_batched_tokens=budget, seed=ctx.seed, cpu_stream=GATE_CPU_STREAM)  # fmt: skip
    with checks_mode(ctx.checks) if ctx.checks else contextlib.nullcontext():
        return llm.generate([list(p) for p in prompts], list(params))


def _audit(llm: LLM) -> None:
    # The gate audits the runtime's own engine (same package), in stream order and without waiting
    # for it: a sync after every step would keep the device level with the host.
    audit_engine(llm._engine, wait=False)


def run_cell(cell: ScheduleCell, ctx: MatrixContext) -> CellReport:
    """Run one cell on the sync and the async path; compare, audit and check its conditions."""
    start = time.perf_counter()
    report = CellReport(cell.name, cell.provokes)
    if cell.needs_speculative and not ctx.factory.supports_speculative:
        report.skipped = f"model {ctx.factory.name!r} does not support speculative decoding"
        return report
    plan = cell.plan(ctx)
    engine = dict(plan.engine)
    factory = ctx.factory
    if "honors_device_token_ids" in engine:  # a property of the factory, not an engine setting
        factory = dataclasses.replace(factory, honors_device_token_ids=engine.pop("honors_device_token_ids"))
    settings = {
        "device": ctx.device, "max_num_seqs": ctx.max_num_seqs,
        "max_num_batched_tokens": ctx.max_num_batched_tokens, "seed": ctx.seed,
        "cpu_stream": GATE_CPU_STREAM, **engine,
    }  # fmt: skip
    prompts = plan.prompts if plan.prompts is not None else ctx.prompts
    arrivals = _arrivals(prompts, plan.params)
    report.comparisons = ["async vs sync"]
    use_oracle = plan.oracle and ctx.oracle is not None
    if use_oracle:
        report.comparisons += ["sync vs oracle", "async vs oracle"]
    elif not plan.oracle:
        # No oracle for sampled or processed requests: the reference is a sync engine with a slot
        # per request, all admitted at once — no slot is ever reused, no row ever reordered.
        report.comparisons += ["sync vs fresh slots"]
    fresh = None if plan.oracle else _fresh_slots(factory, ctx, prompts, plan.params)
    for attempt in range(plan.attempts):
        report.errors.clear()
        outputs = _run_paths(factory, {**settings, "seed": settings["seed"] + attempt}, arrivals, ctx, report)
        if report.errors:
            break
        report.requests = _compare(prompts, outputs, ctx.oracle if use_oracle else None, fresh)
        report.conditions = cell.conditions(ctx, plan, {"stats": report.stats, "outputs": outputs})
        diverged = not all(r[c].ok for r in report.requests for c in report.comparisons)
        if diverged or all(c.reached for c in report.conditions):
            break
    if plan.attempts > 1 and not report.errors:
        report.conditions.append(Condition("runs (a new seed each) until reached", attempt + 1, "> 0"))
    report.seconds = time.perf_counter() - start
    return report


def _compare(
    prompts: Sequence[Sequence[int]], outputs: dict[str, list[RequestOutput]], oracle: Any | None,
    fresh: list[RequestOutput] | None,
) -> list[dict[str, PathResult]]:
    rows = []
    for i, prompt in enumerate(prompts):
        sync, async_ = outputs["sync"][i], outputs["async"][i]
        row = {"async vs sync": compare_tokens("async vs sync", sync.token_ids, async_)}
        if oracle is not None:
            for path, out in (("sync", sync), ("async", async_)):
                name = f"{path} vs oracle"
                row[name] = compare_tokens(name, oracle.greedy_choices(list(prompt), list(out.token_ids)), out)
        if fresh is not None:
            row["sync vs fresh slots"] = compare_tokens("sync vs fresh slots", fresh[i].token_ids, sync)
        rows.append(row)
    return rows


def _run_paths(
    factory: ModelFactory, settings: dict[str, Any], arrivals: list[Arrival], ctx: MatrixContext,
    report: CellReport,
) -> dict[str, list[RequestOutput]]:
    """The cell's requests on the sync and the async path, audited after every step."""  # fmt: skip
    outputs: dict[str, list[RequestOutput]] = {}
    for path, async_scheduling in (("sync", False), ("async", True)):
        llm = LLM(factory, async_scheduling=async_scheduling, **settings)
        try:
            with checks_mode(ctx.checks) if ctx.checks else contextlib.nullcontext():
                outputs[path] = run_workload(llm, arrivals, after_step=_audit)
                llm._engine.runner.stream.synchronize()  # the last step's device audit
        except Exception as exc:  # as in the baseline: a forward's own error fails the path too
            report.errors[path] = f"{type(exc).__name__}: {exc}"
        report.stats[path] = llm.stats.as_dict()
    return outputs
