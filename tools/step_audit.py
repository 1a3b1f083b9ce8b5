"""The engine's own bookkeeping, checked between steps (the gate's second pair of eyes).

Comparing outputs only catches a bookkeeping bug once it changes a token, and many do so only under
a rare schedule (a slot reused in the very step its previous owner's token resolves). The audit
checks, after a step, what must hold for every request whatever the schedule:

* a waiting request holds no slot and no computed positions (a preempted request rolls nothing back);
* no unfinished request has had a resolved token dropped: every token the device sampled for it is
  in its output (a token that resolves after a preemption still belongs to the request; only a
  finished request's in-flight rows are discarded) — outputs alone cannot show this, since a
  greedy or seeded resume recomputes the dropped token;
* no two running requests share a slot, and each has ``0 <= num_computed <= num_tokens``;
* the host token table of a running request's slot holds exactly the tokens the host knows about it
  (prompt + resolved output) and ``PLACEHOLDER`` beyond them — nothing a previous owner's late
  token wrote there;
* the device token history of that slot holds the same tokens (the history the penalties, bad words
  and the draft proposer read);
* the device ``prefill_len`` of the slot is the request's.

The device checks run on the runner's stream, in stream order: right after the device work of
the step just taken, whatever the host has planned since. ``audit_engine(engine)`` then waits for
them (a device sync, so the audit is for verification runs, not for serving);
``audit_engine(engine, wait=False)`` does not, and a broken device invariant raises at the engine's
next fence instead — the gate audits that way, so the async pipeline keeps its lag between steps
(a sync after every step would put the device back level with the host, and hide every bug that
needs the device to run behind).
"""

from __future__ import annotations

import numpy as np

from tokenstate.contracts import PLACEHOLDER, ContractViolation
from tokenstate.runtime.engine import Engine
from tokenstate.runtime.mirror import DeviceMirror

__all__ = ["audit_engine"]


def _fail(problem: str) -> None:
    raise ContractViolation(
        f"engine state audit: {problem}. The runtime's per-slot bookkeeping broke (a scheduler or "
        "runner bug, not the model's); please report it with the schedule that provoked it."
    )


def audit_engine(engine: Engine, *, wait: bool = True) -> None:
    """Raise :class:`~tokenstate.contracts.ContractViolation` on the first broken invariant.

    Args:
        engine: the engine, between two steps.
        wait: wait for the device checks (they run on the runner's stream, after the work already
            submitted); ``False`` leaves their failure to the engine's next fence.
    """
    scheduler, runner = engine.scheduler, engine.runner
    for req in scheduler.unfinished:
        if req.num_discarded:
            _fail(
                f"request {req.request_id} is unfinished but {req.num_discarded} token(s) resolved for "
                "it were discarded instead of joining its output (only a finished request's tokens "
                "may be discarded)"
            )
    for req in scheduler.waiting:
        if req.slot != -1 or req.num_computed != 0:
            _fail(
                f"waiting request {req.request_id} still holds slot {req.slot} with "
                f"num_computed={req.num_computed} (a waiting request holds neither)"
            )
    owners: dict[int, int] = {}
    expected: list[_SlotExpectation] = []
    for req in scheduler.running:
        if req.slot in owners:
            _fail(f"requests {owners[req.slot]} and {req.request_id} both hold slot {req.slot}")
        owners[req.slot] = req.request_id
        # Drafts in flight count as computed until their step resolves and rolls back the rejected.
        most = req.num_tokens + (runner.num_drafts if req.awaiting_drafts else 0)
        if not 0 <= req.num_computed <= most:
            _fail(f"request {req.request_id} has num_computed={req.num_computed} outside [0, {most}]")
        known = np.array((*req.prompt, *req.output_token_ids), dtype=np.int32)  # [num_known]
        table = runner.table.ids[req.slot, : known.shape[0]]  # [num_known] int32
        wrong = np.flatnonzero(table != known)
        if wrong.size:
            p = int(wrong[0])
            _fail(
                f"host token table of slot {req.slot} (request {req.request_id}) holds {int(table[p])} "
                f"at position {p} where the host knows {int(known[p])}"
            )
        beyond = np.flatnonzero(runner.table.ids[req.slot, known.shape[0] :] != PLACEHOLDER)
        if beyond.size:
            p = known.shape[0] + int(beyond[0])
            _fail(
                f"host token table of slot {req.slot} (request {req.request_id}) holds "
                f"{int(runner.table.ids[req.slot, p])} at position {p}, beyond the {known.shape[0]} "
                "tokens the host knows about the request (a token recorded for a previous owner?)"
            )
        expected.append((req.slot, req.request_id, known, req.prefill_len))
    # Device state is written on the runner's stream: read it there, after the work submitted so
    # far (the host's knowledge of each slot, taken now, is a prefix of what the device holds then).
    runner.stream.submit(_audit_device_state, runner.mirror, tuple(expected))
    if wait:
        runner.stream.synchronize()


_SlotExpectation = tuple[int, int, np.ndarray, int]  # slot, request id, known tokens [num_known], prefill_len


def _audit_device_state(mirror: DeviceMirror, expected: tuple[_SlotExpectation, ...]) -> None:
    """On the stream: each running request's device token history and ``prefill_len``."""
    for slot, request_id, known, prefill_len in expected:
        device = mirror.history[slot, : known.shape[0]].cpu().numpy()  # [num_known] int32
        wrong = np.flatnonzero(device != known)
        if wrong.size:
            p = int(wrong[0])
            _fail(
                f"device token history of slot {slot} (request {request_id}) holds "
                f"{int(device[p])} at position {p} where the request has {int(known[p])}"
            )
        if int(mirror.prefill_len[slot]) != prefill_len:
            _fail(
                f"device prefill_len of slot {slot} is {int(mirror.prefill_len[slot])}, request "
                f"{request_id} was admitted with {prefill_len}"
            )
