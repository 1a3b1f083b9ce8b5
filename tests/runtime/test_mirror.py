"""Device mirror: per-slot seeding, one-copy uploads, and the deferred device→host copy.

The mirror's writes run on its stream (a worker thread on the CPU); a test reads device state after
``mirror.stream.synchronize()``, as the host would after a fence.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tokenstate.contracts import PLACEHOLDER, ContractViolation, IndexPlan
from tokenstate.runtime import SamplingParams
from tokenstate.runtime.input_prep import HostTokenTable, prepare_inputs
from tokenstate.runtime.kernels import StepGuard, guarded_embedding
from tokenstate.runtime.mirror import DeviceMirror, PendingTokens, StagedStep
from tokenstate.runtime.process_stream import ProcessStream, process_stream_available
from tokenstate.runtime.scheduler import Request, Scheduler
from tokenstate.runtime.stream import CpuStream


def test_admit_reseeds_only_the_admitted_slots():
    mirror = DeviceMirror(3, CpuStream(), max_model_len=8)
    mirror.last_sampled.fill_(7)
    mirror.num_computed.fill_(9)
    req = Request(
        0,
        (1, 2, 3),
        SamplingParams(temperature=0.5, top_k=4, top_p=0.9),
        seed=2**62 + 3,
        eos_token_ids=(),
        slot=1,
        prefill_len=3,
    )
    mirror.admit([req])
    mirror.stream.synchronize()
    assert mirror.prefill_len.tolist() == [0, 3, 0]
    assert mirror.num_computed.tolist() == [9, 0, 9]
    assert mirror.last_sampled.tolist() == [7, PLACEHOLDER, 7]
    assert (
        mirror.top_k[1] == 4
        and mirror.temperature[1] == 0.5
        and abs(float(mirror.top_p[1]) - 0.9) < 1e-6
    )
    assert int(mirror.seed[1]) == 3  # seeds are kept to 62 bits for the sampler's hash
    assert mirror.history[1, :3].tolist() == [1, 2, 3]  # the device history knows the prompt


def test_admit_seeds_the_history_with_everything_the_host_knows():
    """A request resumed after preemption re-prefills its prompt and its resolved output."""
    mirror = DeviceMirror(2, CpuStream(), max_model_len=8)
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=0.25, frequency_penalty=0.5)
    req = Request(0, (4, 5), params, seed=0, eos_token_ids=(), slot=1, prefill_len=4)
    req.output_token_ids.extend([6, 7])
    mirror.admit([req])
    mirror.stream.synchronize()
    assert mirror.history[1, :4].tolist() == [4, 5, 6, 7] and mirror.prefill_len[1] == 4
    assert mirror.repetition_penalty.tolist() == [1.0, 1.5]
    assert mirror.presence_penalty.tolist() == [0.0, 0.25]
    assert mirror.frequency_penalty.tolist() == [0.0, 0.5]


def _prefill_rows(prompts: tuple[tuple[int, ...], ...], *, spliced: bool = False):
    """The host inputs of a first step admitting ``prompts`` to slots 0, 1, ..."""
    sched = Scheduler(max_num_seqs=len(prompts), max_num_batched_tokens=64, max_model_len=16)
    table = HostTokenTable(len(prompts), 16)
    for i, prompt in enumerate(prompts):
        sched.add(Request(i, prompt, SamplingParams(), seed=0, eos_token_ids=()))
    batch = sched.schedule()
    for req in batch.admitted:
        table.admit(req)
    return prepare_inputs(batch, table, spliced=spliced)


def _two_prefill_rows(*, spliced: bool):
    """The host inputs of a first step: prompts (5, 6, 7) and (8, 9) admitted to slots 0 and 1."""
    return _prefill_rows(((5, 6, 7), (8, 9)), spliced=spliced)


def test_copy_in_copies_every_field_into_device_buffers_not_host_views():
    step = _two_prefill_rows(spliced=True)
    mirror = DeviceMirror(2, CpuStream(), max_model_len=16, capacity=4)  # too small on purpose: the staging buffer grows
    dev = mirror.stage(step).copy_in()
    assert dev.host_ids.tolist() == [5, 6, 7, 8, 9]
    assert dev.positions.dtype == torch.int64 and dev.positions.tolist() == [0, 1, 2, 0, 1]
    assert dev.query_start_loc.tolist() == [0, 3, 5] and dev.seq_lens.tolist() == [3, 2]
    assert dev.logits_indices.tolist() == [2, 4] and dev.sample_output_index.tolist() == [0, 0]
    step.positions[0] = 99  # the host array is staging input only: the device copy is separate
    assert dev.positions[0] == 0


def test_pending_tokens_resolve_late_and_raise_recorded_violations():
    mirror = DeviceMirror(2, CpuStream(), max_model_len=8)
    sampled = torch.tensor([4, 5], dtype=torch.int32)
    guard = StepGuard()
    with guard:
        guarded_embedding(torch.tensor([0, PLACEHOLDER]), torch.zeros(8, 2))  # recorded, not raised
    host = mirror.results_buffer(2)
    mirror.stream.submit(mirror.copy_results, host, sampled)
    pending = PendingTokens(host, mirror.stream.record_event(), guard, None)
    with pytest.raises(ContractViolation, match="PLACEHOLDER"):
        pending.resolve()
    clean_host = mirror.results_buffer(2)
    mirror.stream.submit(mirror.copy_results, clean_host, torch.tensor([1, 2], dtype=torch.int32))
    clean = PendingTokens(clean_host, mirror.stream.record_event(), StepGuard(), None)
    assert np.array_equal(clean.resolve(), [1, 2])
    assert host.data_ptr() != clean_host.data_ptr()  # two result buffers alternate


def test_staging_waits_for_the_copy_of_the_buffer_it_rewrites():
    """The staging-reuse fence: with the stream held up, the third stage waits for the first copy."""
    stream = CpuStream()
    mirror = DeviceMirror(1, stream, max_model_len=8, capacity=8)
    gate = threading.Event()
    stream.submit(gate.wait)  # the stream is busy until the gate opens
    staging = mirror._staging

    def stage_and_copy(values: list[int]) -> torch.Tensor:
        turn, dev, host, _ = staging.stage([np.array(values, dtype=np.int32)])
        stream.submit(dev.copy_, host)
        staging.fenced(turn, stream.record_event())
        return dev

    first = stage_and_copy([1, 2])
    stage_and_copy([3, 4])  # the other buffer: no wait
    third = threading.Thread(target=stage_and_copy, args=([5, 6],))
    third.start()
    third.join(timeout=0.2)
    assert third.is_alive()  # blocked on the fence of the first copy, not rewriting its buffer
    gate.set()
    third.join(timeout=5)
    assert not third.is_alive()
    stream.synchronize()
    assert first.tolist() == [5, 6]  # one device buffer, written in stream order


def test_staging_carries_the_model_plan_in_the_int64_copy_and_skips_unused_host_ids():
    step = _two_prefill_rows(spliced=False)
    mirror = DeviceMirror(2, CpuStream(), max_model_len=16, capacity=4)
    plan = IndexPlan((np.array([3, 1], dtype=np.int64), np.array([7], dtype=np.int64)), meta="m")
    dev = mirror.stage(step, plan, host_ids=False).copy_in()
    assert dev.host_ids is None  # no combine on this step: nothing reads uploaded host ids
    assert [t.tolist() for t in dev.model_indices] == [[3, 1], [7]]
    assert all(t.dtype == torch.int64 for t in dev.model_indices)
    # One staging copy per dtype: the plan's tensors are views of the same device buffer as positions.
    assert dev.model_indices[0].untyped_storage().data_ptr() == dev.positions.untyped_storage().data_ptr()
    plan.arrays[0][0] = 99  # the host plan is staging input only
    assert dev.model_indices[0][0] == 3


def _positions_into(dst: torch.Tensor, staged: StagedStep) -> None:
    """Device task: copy the staged step in and write its first positions into ``dst``."""
    positions = staged.copy_in().positions  # [num_tokens] int64
    n = min(dst.shape[0], positions.shape[0])
    dst[:n].copy_(positions[:n])


@pytest.mark.skipif(not process_stream_available(), reason="the device process needs Linux")
def test_steps_staged_on_either_side_of_a_staging_growth_copy_in_their_own_inputs_on_the_device_process():
    """A step's task references its staging buffers; one staged before they grew still reads its own."""
    stream = ProcessStream()
    mirror = DeviceMirror(2, stream, max_model_len=16, capacity=24)  # the small step fits, the big one grows it
    stream.start(mirror.device_objects())
    try:
        out = stream.host_buffer(16, torch.int64)  # [16]
        stream.submit(time.sleep, 0.2)  # the device process reaches neither step before both are staged
        stream.submit(_positions_into, out[:8], mirror.stage(_prefill_rows(((5, 6), (7,)))))
        grown = _prefill_rows(((1, 2, 3, 4, 5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15)))
        stream.submit(_positions_into, out[8:], mirror.stage(grown))
        assert mirror._staging.capacity > 24 and mirror._staging_long.capacity > 24
        stream.synchronize()
        assert out[:3].tolist() == [0, 1, 0]
        assert out[8:].tolist() == list(range(8))
    finally:
        stream.close()
