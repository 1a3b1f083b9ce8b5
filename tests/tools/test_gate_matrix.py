"""The gate's schedule matrix, the per-step engine audit and the progress watchdog."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tokenstate.contracts import (
    ConfigError,
    ContractViolation,
    ForwardInput,
    TokenStateError,
    entry_point,
)
from tokenstate.models.toy import ToyLM, _mix_and_project, toy_factory
from tokenstate.runtime import LLM, SamplingParams
from tokenstate.runtime.request import Request
from tokenstate.runtime.watchdog import EngineStalledError, ProgressWatchdog, default_stall_limit
from tokenstate.tools.gate import GateConfig, run_gate
from tokenstate.tools.gate_matrix import CELLS, CellReport, Condition
from tokenstate.tools.step_audit import audit_engine


def test_every_cell_reaches_its_condition_on_the_toy_model():
    report = run_gate(toy_factory("MatrixToy", eos_token_id=None), GateConfig(oracle=False))
    assert [c.name for c in report.cells] == [c.name for c in CELLS]
    for cell in report.cells:
        assert not cell.skipped and cell.passed, (cell.name, cell.conditions, cell.errors)
        assert cell.conditions and all(c.reached for c in cell.conditions)
        assert cell.totals()["async vs sync"][1] > 0
    assert report.passed and report.to_json()["cells"][0]["conditions"][0]["reached"] is True


def test_quick_runs_the_baseline_alone_and_a_model_without_drafts_skips_their_cell():
    assert run_gate(toy_factory(), GateConfig(oracle=False, quick=True)).cells == []
    no_drafts = dataclasses.replace(toy_factory("NoDraftsToy"), supports_speculative=False)
    report = run_gate(no_drafts, GateConfig(oracle=False))
    cells = {c.name: c for c in report.cells}
    assert "does not support speculative decoding" in cells["n-gram drafts"].skipped
    assert cells["n-gram drafts"].passed and cells["all at once"].passed
    # Without drafts a prefill chunk is never skipped (admission leaves it budget): the chunked
    # cell asks only for what such a model can reach, and a correct model passes the gate.
    chunked = cells["chunked prefill + budget skips"]
    assert chunked.passed and "skipped prefill rows" not in [c.name for c in chunked.conditions]
    assert report.passed


def test_a_cell_whose_condition_was_not_reached_fails():
    cell = CellReport("preemption + resume", "…", conditions=[Condition("preemptions", 0, "> 0")])
    assert not cell.passed
    assert CellReport("x", "…", conditions=[Condition("bad words generated", 0, "= 0")]).passed


def test_the_audit_names_a_host_table_entry_that_no_longer_matches_the_request():
    llm = LLM(toy_factory(), max_num_seqs=2)
    llm.add_request([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    llm.step()
    llm.step()
    engine = llm._engine
    runner = engine.runner
    audit_engine(engine)  # consistent
    (req,) = engine.scheduler.running
    runner.table.ids[req.slot, 1] = 99  # a late token of a previous owner, say
    with pytest.raises(ContractViolation, match=rf"host token table of slot {req.slot} .* holds 99 at position 1"):
        audit_engine(engine)


def test_the_watchdog_counts_only_steps_without_progress():
    req = Request(4, (1, 2, 3), SamplingParams(max_tokens=3), 0, ())
    dog = ProgressWatchdog(3)
    for _ in range(2):
        dog.after_step([req], 0)  # the first step sees the request: progress; then one idle step
    req.num_computed = 2  # a prefill chunk ran: progress resets the count
    dog.after_step([req], 0)
    dog.after_step([req], 0)
    dog.after_step([req], 0)
    with pytest.raises(EngineStalledError, match=r"3 steps without progress.*request 4 \(waiting, 2/3") as caught:
        dog.after_step([req], 0)
    assert caught.value.request_ids == (4,) and isinstance(caught.value, TokenStateError)
    req.num_computed = 0  # a preemption: below the high-water mark is no progress
    with pytest.raises(EngineStalledError):
        dog.after_step([req], 0)
    assert default_stall_limit(128, 4) == 96
    with pytest.raises(TokenStateError, match="positive int"):
        ProgressWatchdog(0)


def test_max_tokens_that_leave_no_room_for_chunked_prompts_are_refused():
    with pytest.raises(ConfigError, match=r"max_tokens=100 leaves prompts of at most 27 tokens .* lower max_tokens to at most 94"):
        run_gate(toy_factory(), GateConfig(oracle=False, quick=True, max_tokens=100))
    assert run_gate(toy_factory(), GateConfig(oracle=False, quick=True, max_tokens=94, num_requests=2)).passed



def test_the_command_lines_default_max_tokens_fits_a_short_context():
    """``tokenstate gate``/``verify`` without --max-tokens on a short-context model run as many tokens
    as fit beside a chunked prompt (the tutorial's 64-token model) instead of refusing their default."""
    fitted = GateConfig(oracle=False, quick=True, max_tokens=100, fit_max_tokens=True, num_requests=2)
    report = run_gate(toy_factory(), fitted)
    assert report.passed and report.totals()["async vs sync"] == (2 * 94, 2 * 94)



@entry_point
def _raw_buffer_into_plain_embedding(model: ToyLM, inp: ForwardInput) -> torch.Tensor:
    hidden = F.embedding(inp.host_tokens._ids.long(), model.embed)  # PLACEHOLDER -> IndexError
    return _mix_and_project(model, inp, hidden)


def test_a_forward_that_raises_outside_tokenstate_fails_the_gate_naming_the_path():
    """A plain embedding fed the raw host buffer raises torch's own ``IndexError`` at the
    placeholders: the gate's report names the async path and the error, instead of crashing."""
    factory = dataclasses.replace(toy_factory("RawEmbedToy"), forward=_raw_buffer_into_plain_embedding)
    report = run_gate(factory, GateConfig(oracle=False, quick=True, num_requests=3, max_tokens=6))
    assert not report.passed and list(report.errors) == ["async"]
    assert report.errors["async"].startswith("IndexError: index out of range")
    full = run_gate(factory, GateConfig(oracle=False, num_requests=3, max_tokens=6))
    assert not full.passed  # the baseline's error ends the run: no cell is started
