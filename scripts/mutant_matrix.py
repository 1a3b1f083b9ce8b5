"""Which realistic runtime/model bugs do the tests catch, and which does ``tokenstate verify``?

Each mutant below models a bug a real async engine shipped, in one of seven families (row order,
placeholders for requests absent from the previous batch, per-slot state on slot reuse, one-step-
stale ordering, host-side history readers, preemption/resume, chunked and padded rows, lying
models). For every mutant the script

(a) runs the relevant tests with the mutant applied (a pytest subprocess loading this file as a
    plugin, ``TOKENSTATE_MUTANT=<name>``), and
(b) runs the token gate of ``tokenstate verify`` on the three reference models with the mutant
    applied — once as ``--quick`` (the single baseline schedule the gate ran before the schedule
    matrix) and once as the default (baseline + matrix) — in a subprocess with a time limit,

and prints a table: mutant → caught by tests / caught by verify --quick / caught by verify.

    python scripts/mutant_matrix.py                 # every mutant (tens of minutes on 2 cores)
    python scripts/mutant_matrix.py --only NAME ... # a few
    python scripts/mutant_matrix.py --list

A mutant must model its bug in the code as it is now: ``tests/tools/test_mutant_matrix.py`` runs
each one and refuses an error raised by the mutant's own code (a wrapper whose signature rotted
crashes the engine, and a crash would count as a catch). An equivalent mutant is dropped, not kept
as a miss: ``draft-checkpoint-survives-reset`` (a slot reset that left the draft tracker alone)
changed nothing, since the tracker ignores a slot's pending checkpoint at its new owner's first row
(every admission prefills from position 0) — and the reset no longer touches the tracker at all: it
runs on the stream, behind the host's planning (spec item ASY-21).

The spec step of ``verify`` re-runs the spec tests, which (a) already covers; (b) is the rest of the
main job: the routing checker reads source files, so a runtime monkeypatch is invisible to it, and
the gate is what must catch these.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "TOKENSTATE_MUTANT"
TESTS = ["tests/runtime", "tests/models", "specs"]
# Tests that run the gate itself (its CLI, its matrix) would count verify's catches as the tests':
# column (a) is the test suite without them.
NOT_TESTS = ["tests/tools/test_cli.py", "tests/tools/test_gate_matrix.py"]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    family: str
    doc: str
    apply: Callable[[Any], None]  # apply(patch: MutantPatch)


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, family: str, doc: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        MUTANTS[name] = Mutant(name, family, doc, fn)
        return fn

    return register


def _runner_module() -> Any:
    return importlib.import_module("tokenstate.runtime.runner")


# -- row order ---------------------------------------------------------------------------------


@mutant("penalty-params-by-row", "row order", "penalty strengths gathered by batch row, not by slot")
def _penalty_params_by_row(patch: Any) -> None:
    runner = _runner_module()
    apply = runner.apply_penalties

    def by_row(logits, history, slots, positions, out_index, rep, pres, freq, *, length):
        mirror = _CURRENT[-1].mirror
        rows = torch.arange(slots.shape[0]) % mirror.repetition_penalty.shape[0]
        return apply(logits, history, slots, positions, out_index, mirror.repetition_penalty[rows],
                     mirror.presence_penalty[rows], mirror.frequency_penalty[rows], length=length)

    _note_runner(patch)
    patch.setattr(runner, "apply_penalties", by_row)


@mutant("seeds-by-row", "row order", "sampling seeds/temperature gathered by batch row, not by slot")
def _seeds_by_row(patch: Any) -> None:
    runner = _runner_module()
    rows_of = runner.ModelRunner._sampling_rows

    def by_row(self, sampling, dev):
        rows = rows_of(self, sampling, dev)
        index = torch.arange(dev.sample_slots.shape[0]) % self.mirror.seed.shape[0]
        return dataclasses.replace(rows, seeds=self.mirror.seed[index], temperature=self.mirror.temperature[index])

    patch.setattr(runner.ModelRunner, "_sampling_rows", by_row)


@mutant("last-sampled-by-row", "row order", "post-update scatters each row's token into last_sampled[row]")
def _last_sampled_by_row(patch: Any) -> None:
    runner = _runner_module()
    update = runner.post_update

    def by_row(sampled, cu, num_sampled, keep, qsl, num_drafts, slots, last_sampled, num_computed, **options):
        rows = torch.arange(slots.shape[0], dtype=slots.dtype) % last_sampled.shape[0]
        scratch = last_sampled.clone()
        update(sampled, cu, num_sampled, keep, qsl, num_drafts, rows, scratch, num_computed.clone(), **options)
        update(sampled, cu, num_sampled, keep, qsl, num_drafts, slots, last_sampled.clone(), num_computed, **options)
        last_sampled.copy_(scratch)

    patch.setattr(runner, "post_update", by_row)


def _host_history_index(mirror: Any, rows: np.ndarray, positions: np.ndarray) -> torch.Tensor:
    """``[n]`` int64 flat history indices of ``(row, position)`` pairs, from the host's arrays (a
    mutant computing them from the staged device views would read them before the copy ran)."""
    index = rows.astype(np.int64) * mirror.max_model_len + positions.astype(np.int64)
    return torch.from_numpy(index).to(mirror.device)


class _Replaced:
    """A staged step whose device inputs have some fields replaced (a mutant's staging result)."""

    def __init__(self, staged: Any, **fields: Any) -> None:
        self.staged, self.fields = staged, fields

    @property
    def turns(self) -> tuple[int, int]:
        return self.staged.turns

    def copy_in(self) -> Any:
        return dataclasses.replace(self.staged.copy_in(), **self.fields)


@mutant("history-by-row", "row order", "sampled tokens written into the device history of history[row]")
def _history_by_row(patch: Any) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    stage = DeviceMirror.stage

    def by_row(self, step, *args, **kwargs):
        rows = np.arange(step.sample_slots.shape[0]) % self.history.shape[0]
        index = _host_history_index(self, rows, step.sample_positions)
        return _Replaced(stage(self, step, *args, **kwargs), history_index=index)

    patch.setattr(DeviceMirror, "stage", by_row)


@mutant("kda-group-slots-reversed", "row order", "KDA advances a group of equal-length rows with its slot list reversed")
def _kda_group_slots_reversed(patch: Any) -> None:
    kda = importlib.import_module("tokenstate.models.kda")
    kimi = importlib.import_module("tokenstate.models.kimi_linear")
    groups_of = kda.recurrent_groups

    def reversed_slots(inp, *, num_slots):
        groups = groups_of(inp, num_slots=num_slots)
        return tuple(
            dataclasses.replace(g, slots=g.slots.flip(0)) if isinstance(g.slots, torch.Tensor) else g for g in groups
        )

    patch.setattr(kimi, "recurrent_groups", reversed_slots)


# -- placeholders for requests absent from the previous batch ------------------------------------


@mutant("stale-prefill-len-on-admit", "absent from previous batch", "admission to a reused slot keeps the previous owner's device prefill_len")
def _stale_prefill_len(patch: Any) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    admit = DeviceMirror.admit

    def keeping(self, requests):
        kept = self.prefill_len.clone()
        reused = _reused(self, requests)
        admit(self, requests)
        self.prefill_len[reused] = kept[reused]

    patch.setattr(DeviceMirror, "admit", keeping)


@mutant("resume-with-prompt-prefill-len", "absent from previous batch", "a resumed request is admitted with prefill_len = its prompt length")
def _resume_prompt_prefill(patch: Any) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    admit = Scheduler._admit

    def admit_prompt(self, req):
        admit(self, req)
        req.prefill_len = min(req.prefill_len, len(req.prompt) + max(0, len(req.output_token_ids) - 1))

    patch.setattr(Scheduler, "_admit", admit_prompt)


@mutant("host-stale-mask-off-by-one", "absent from previous batch", "host stale mask uses seq_len >= prefill_len: a prefill's last chunk counts as spliced")
def _stale_mask_off_by_one(patch: Any) -> None:
    prep = importlib.import_module("tokenstate.runtime.input_prep")
    mask = prep.stale_position_mask

    def off_by_one(qsl, seq_lens, prefill_lens, num_drafts=None):
        return mask(qsl, seq_lens, prefill_lens - 1, num_drafts)

    patch.setattr(prep, "stale_position_mask", off_by_one)


# -- per-slot state on slot reuse ------------------------------------------------------------------


@mutant("no-model-reset-on-admit", "slot reuse", "the runner does not call model.reset_slot when a slot gets a new owner")
def _no_model_reset(patch: Any) -> None:
    runner = _runner_module()

    def admit(self, admitted):
        for req in admitted:
            self.table.admit(req)
        self.mirror.admit(admitted)

    patch.setattr(runner.ModelRunner, "_admit", admit)


@mutant("sampling-params-not-reseeded", "slot reuse", "a reused slot keeps the previous owner's temperature/top-k/top-p/seed")
def _sampling_not_reseeded(patch: Any) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    admit = DeviceMirror.admit

    def keeping(self, requests):
        state = (self.temperature, self.top_k, self.top_p, self.seed)
        kept = [t.clone() for t in state]
        reused = _reused(self, requests)
        admit(self, requests)
        for t, old in zip(state, kept, strict=True):
            t[reused] = old[reused]

    patch.setattr(DeviceMirror, "admit", keeping)


@mutant("resumed-history-prompt-only", "slot reuse", "a resumed request's device history is reseeded with its prompt only")
def _history_prompt_only(patch: Any) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    admit = DeviceMirror.admit

    def prompt_only(self, requests):
        admit(self, requests)
        spans = [(r.slot, len(r.prompt), len(r.output_token_ids)) for r in requests if r.output_token_ids]

        def forget_outputs() -> None:  # on the stream, right behind the reseed (not racing it)
            for slot, start, count in spans:
                self.history[slot, start : start + count] = 0

        if spans:
            self.stream.submit(forget_outputs)

    patch.setattr(DeviceMirror, "admit", prompt_only)


# -- one-step-stale ordering -----------------------------------------------------------------------


@mutant("last-sampled-stale-after-drafts", "one-step stale", "after a row with drafts, last_sampled keeps the previous step's token")
def _last_sampled_stale(patch: Any) -> None:
    runner = _runner_module()
    update = runner.post_update

    def stale(sampled, cu, num_sampled, keep, qsl, num_drafts, slots, last_sampled, num_computed, **options):
        before = last_sampled.clone()
        update(sampled, cu, num_sampled, keep, qsl, num_drafts, slots, last_sampled, num_computed, **options)
        drafted = slots[num_drafts > 0].long()
        last_sampled[drafted] = before[drafted]

    patch.setattr(runner, "post_update", stale)


@mutant("history-position-off-by-one", "one-step stale", "each sampled token is written one position early into the device history")
def _history_off_by_one(patch: Any) -> None:
    from tokenstate.runtime.mirror import DeviceMirror

    stage = DeviceMirror.stage

    def early(self, step, *args, **kwargs):
        index = _host_history_index(self, step.sample_slots, step.sample_positions - 1)
        return _Replaced(stage(self, step, *args, **kwargs), history_index=index)

    patch.setattr(DeviceMirror, "stage", early)


@mutant("fallback-drafts-known-at-scheduling", "one-step stale", "fallback steps feed the drafts known when the step was scheduled (spec ASY-9)")
def _fallback_drafts(patch: Any) -> None:
    _spec_mutant("fallback_feeds_drafts_known_at_scheduling")(patch)


@mutant("resolve-before-record-order", "one-step stale", "the host records resolved tokens at the previous row's positions")
def _record_shifted(patch: Any) -> None:
    from tokenstate.runtime.input_prep import HostTokenTable

    record = HostTokenTable.record
    patch.setattr(HostTokenTable, "record", lambda self, slots, positions, tokens: record(self, slots, positions - 1, tokens))


# -- host-side history readers ---------------------------------------------------------------------


@mutant("bad-words-read-host-table", "history readers", "bad-word matching reads the host token table (spec ASY-10)")
def _bad_words_host(patch: Any) -> None:
    _spec_mutant("bad_words_read_host_table")(patch)


@mutant("penalties-read-host-table", "history readers", "repetition/presence/frequency penalties read the host token table (spec ASY-19)")
def _penalties_host(patch: Any) -> None:
    _spec_mutant("penalties_read_host_table")(patch)


@mutant("proposer-reads-host-table", "history readers", "the n-gram proposer reads the host token table (placeholders and all)")
def _proposer_host(patch: Any) -> None:
    runner = _runner_module()
    propose = runner.propose_ngram

    def host(history, *args, **kwargs):
        return propose(torch.from_numpy(_CURRENT[-1].table.ids.copy()), *args, **kwargs)

    _note_runner(patch, method="_device_step")  # where the proposer runs: on the stream
    patch.setattr(runner, "propose_ngram", host)


# -- preemption / resume ---------------------------------------------------------------------------


@mutant("record-into-lost-slot", "preemption/resume", "a late token is recorded into the slot its request lost (spec ASY-8)")
def _record_lost(patch: Any) -> None:
    _spec_mutant("record_into_lost_slot")(patch)


@mutant("rollback-after-preemption", "preemption/resume", "drafts of a preempted request are rolled back anyway (spec ASY-11)")
def _rollback_lost(patch: Any) -> None:
    _spec_mutant("rollback_after_preemption")(patch)


@mutant("drop-token-of-preempted", "preemption/resume", "a token resolved after its request was preempted is dropped")
def _drop_preempted(patch: Any) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    emits = Scheduler._emits
    patch.setattr(Scheduler, "_emits", staticmethod(lambda req: emits(req) and req.slot >= 0))


@mutant("readmit-with-token-in-flight", "preemption/resume", "a preempted request is re-admitted before its in-flight token resolved (spec ASY-16)")
def _readmit_in_flight(patch: Any) -> None:
    _spec_mutant("readmit_with_token_in_flight")(patch)


# -- chunked and padded rows -----------------------------------------------------------------------


@mutant("chunk-positions-restart", "chunked/padded rows", "a continued prefill chunk gets positions from 0 again")
def _chunk_positions(patch: Any) -> None:
    prep = importlib.import_module("tokenstate.runtime.input_prep")
    runner = _runner_module()
    prepare = prep.prepare_inputs

    def restart(batch, table, *, spliced):
        step = prepare(batch, table, spliced=spliced)
        positions = step.positions.copy()
        for r, row in enumerate(batch.rows):
            if row.num_computed < row.request.prefill_len and row.num_computed > 0:
                lo, hi = step.query_start_loc[r], step.query_start_loc[r + 1]
                positions[lo:hi] -= row.num_computed
        return dataclasses.replace(step, positions=positions)

    patch.setattr(runner, "prepare_inputs", restart)


@mutant("mamba-conv-state-off-by-one", "chunked/padded rows", "Mamba2 keeps the wrong K-1 inputs as conv state after a prefill chunk")
def _mamba_conv(patch: Any) -> None:
    mamba2 = importlib.import_module("tokenstate.models.mamba2")
    scan = mamba2.Mamba2Mixer._scan_row

    def shifted(self, xbc, dt, conv_state, ssm_state, slot):
        y = scan(self, xbc, dt, conv_state, ssm_state, slot)
        if xbc.shape[0] > 1:
            conv_state[slot] = torch.cat([xbc[-2:-1].t(), conv_state[slot][:, :-1]], dim=-1)
        return y

    patch.setattr(mamba2.Mamba2Mixer, "_scan_row", shifted)


@mutant("skipped-row-advances", "chunked/padded rows", "a running prefill skipped by the budget still advances num_computed by one")
def _skip_advances(patch: Any) -> None:
    from tokenstate.runtime.scheduler import Scheduler

    schedule = Scheduler.schedule

    def advancing(self):
        before = self.stats.skipped_rows
        batch = schedule(self)
        if self.stats.skipped_rows > before:
            chosen = {id(r.request) for r in batch.rows}
            for req in self.running:
                if id(req) not in chosen and req.num_computed < req.prefill_len - 1:
                    req.num_computed += 1
                    break
        return batch

    patch.setattr(Scheduler, "schedule", advancing)


# -- lying models ----------------------------------------------------------------------------------


@mutant("kimi-embeds-clamped-host-buffer", "lying models", "Kimi-Linear declares honoured ids but embeds the host buffer, placeholders clamped to 0")
def _kimi_host(patch: Any) -> None:
    kimi = importlib.import_module("tokenstate.models.kimi_linear")
    embed = kimi.guarded_embedding

    def host_buffer(ids, weight, *, backend="auto"):
        inp = sys._getframe(1).f_locals["inp"]  # the forward's input: the lie reads its host buffer
        # (through the private field: placeholder_buffer() is refused to a forward on a spliced step)
        return embed(inp.host_tokens._ids.clamp(min=0).to(ids.device), weight, backend=backend)

    patch.setattr(kimi, "guarded_embedding", host_buffer)


@mutant("recurrent-drafts-not-rolled-back", "lying models", "NemotronH/Kimi-Linear claim speculative support but never restore checkpoints (spec ASY-13)")
def _no_restore(patch: Any) -> None:
    _spec_mutant("recurrent_drafts_not_rolled_back")(patch)


@mutant("nemotron-scope-publishes-host-ids", "lying models", "NemotronH's scope publishes the host buffer (placeholders as 0) to its deep embed")
def _scope_host(patch: Any) -> None:
    scope = importlib.import_module("tokenstate.models.scope")

    def host_ids(self):
        return self._host_tokens._ids.clamp(min=0).to(self._device)  # private: see _kimi_host

    patch.setattr(scope.StepScope, "embedding_ids", host_ids)


# -- helpers ----------------------------------------------------------------------------------------

_CURRENT: list[Any] = []  # the runner whose step is running (for mutants that read its host table)


def _reused(mirror: Any, requests: Any) -> list[int]:
    """Slots among ``requests`` that an earlier admission on this mirror already used."""
    seen = mirror.__dict__.setdefault("_mutant_seen_slots", set())
    reused = [r.slot for r in requests if r.slot in seen]
    seen.update(r.slot for r in requests)
    return reused


def _note_runner(patch: Any, method: str = "_process_logits") -> None:
    runner = _runner_module()
    original = getattr(runner.ModelRunner, method)

    def noting(self, *args, **kwargs):
        _CURRENT.append(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _CURRENT.pop()

    patch.setattr(runner.ModelRunner, method, noting)


def _spec_mutant(name: str) -> Callable[[Any], None]:
    """The apply function of a mutant recorded in the spec ledger (specs/tests/*_mutants.py)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module = importlib.import_module("specs.tests.async_scheduling_mutants")
    return getattr(module, name)._apply


def apply_mutant(name: str) -> Any:
    from tokenstate.ledger import MutantPatch

    patch = MutantPatch(name)
    MUTANTS[name].apply(patch)
    return patch


# -- the pytest plugin side -------------------------------------------------------------------------


def pytest_configure(config: Any) -> None:
    name = os.environ.get(ENV_VAR)
    if name:
        import tokenstate.models  # noqa: F401  (the mutants patch model modules too)

        apply_mutant(name)


# -- the driver --------------------------------------------------------------------------------------


def _gate_verdicts(name: str) -> dict[str, Any]:
    """In this process: the gate on the three reference models under mutant ``name``.

    The gate's baseline schedule is exactly what ``--quick`` runs, so one run gives both verdicts:
    ``quick`` (the baseline failed) and ``full`` (the baseline or a matrix cell failed).
    """
    import tokenstate.models  # noqa: F401
    from tokenstate.tools.gate import GateConfig, run_gate

    apply_mutant(name)
    quick = {"caught": False, "notes": []}
    full = {"caught": False, "notes": []}
    for model in ("tiny-llama", "tiny-nemotron-h", "tiny-kimi-linear"):
        try:
            report = run_gate(model, GateConfig())
        except Exception as exc:
            for verdict in (quick, full):
                verdict["caught"] = True
                verdict["notes"].append(f"{model}: crashed {type(exc).__name__}")
            continue
        if not report.baseline_passed:
            quick["caught"] = True
            quick["notes"].append(f"{model}: baseline")
        if not report.passed:
            full["caught"] = True
            failing = (["baseline"] if not report.baseline_passed else []) + [c.name for c in report.cells if not c.passed]
            full["notes"].append(f"{model}: {', '.join(failing)}")
    return {"quick": quick, "full": full}


def _run_gate_subprocess(name: str, timeout: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--gate-one", name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: threads only contend on a shared box
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        # A hang would fail verify only through an external timeout: count it as missed.
        hung = {"caught": False, "notes": [f"hung: killed after {timeout} s"]}
        return {"quick": hung, "full": hung}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        crashed = {"caught": True, "notes": [f"gate process exited {proc.returncode}: {proc.stderr.strip()[-200:]}"]}
        return {"quick": crashed, "full": crashed}
    return json.loads(lines[-1])


def _run_tests(name: str, timeout: int) -> dict[str, Any]:
    env = {**os.environ, ENV_VAR: name, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'scripts'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "mutant_matrix", "-p", "no:randomly",
           "-p", "no:cacheprovider", *TESTS, *(f"--ignore={path}" for path in NOT_TESTS)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"caught": True, "notes": [f"tests timed out after {timeout} s"]}
    failed = [line.split(" ")[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"caught": proc.returncode != 0, "notes": failed[:2] or [proc.stdout.strip().splitlines()[-1:]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="mutant names to run")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--no-tests", action="store_true", help="skip (a), the test runs")
    parser.add_argument("--no-gate", action="store_true", help="skip (b), the gate runs")
    parser.add_argument("--merge", nargs=2, type=Path, default=None, metavar=("TESTS_JSON", "GATE_JSON"),
                        help="print the table from a --no-gate run and a --no-tests run")
    parser.add_argument("--gate-one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.gate_one:
        print(json.dumps(_gate_verdicts(args.gate_one)))
        return 0
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.family:28} {m.name:36} {m.doc}")
        return 0
    if args.merge:
        by_tests = {r["mutant"]: r for r in json.loads(args.merge[0].read_text())}
        rows = json.loads(args.merge[1].read_text())
        for row in rows:
            row["tests"] = by_tests[row["mutant"]]["tests"]
        _print_table(rows)
        return 0
    names = args.only or list(MUTANTS)
    rows = []
    skipped = {"caught": None, "notes": []}
    for name in names:
        start = time.perf_counter()
        tests = skipped if args.no_tests else _run_tests(name, timeout=900)
        gate = {"quick": skipped, "full": skipped} if args.no_gate else _run_gate_subprocess(name, timeout=600)
        quick, full = gate["quick"], gate["full"]
        row = {"mutant": name, "family": MUTANTS[name].family, "tests": tests, "verify_quick": quick, "verify": full,
               "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
        rows.append(row)
        mark = {True: "caught", False: "MISSED", None: "—"}
        print(f"{MUTANTS[name].family:28} {name:36} tests {mark[tests['caught']]:7} "
              f"verify --quick {mark[quick['caught']]:7} verify {mark[full['caught']]:7} "
              f"[{row['seconds']} s] {'; '.join(full['notes'])[:160]}", flush=True)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    _print_table(rows)
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    mark = {True: "caught", False: "MISSED", None: "—"}
    print("\n| family | mutant | tests | verify --quick (old gate) | verify (matrix) | what caught it |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['family']} | {r['mutant']} | {mark[r['tests']['caught']]} | {mark[r['verify_quick']['caught']]} | "
              f"{mark[r['verify']['caught']]} | {'; '.join(r['verify']['notes'])[:120]} |")
    count = {key: sum(bool(r[key]['caught']) for r in rows) for key in ("tests", "verify_quick", "verify")}
    print(f"\n{len(rows)} mutants: tests caught {count['tests']}, verify --quick caught {count['verify_quick']}, "
          f"verify caught {count['verify']}")


if __name__ == "__main__":
    sys.exit(main())
