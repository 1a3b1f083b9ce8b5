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

Reading the device history waits for the runner's stream (a device sync), so the audit is for
verification runs (the gate), not for serving.
"""

from __future__ import annotations

import numpy as np

from tokenstate.contracts import PLACEHOLDER, ContractViolation
from tokenstate.runtime.engine import Engine

__all__ = ["audit_engine"]


def _fail(problem: str) -> None:
    raise ContractViolation(
        f"engine state audit: {problem}. The runtime's per-slot bookkeeping broke (a scheduler or "
        "runner bug, not the model's); please report it with the schedule that provoked it."
    )


def audit_engine(engine: Engine) -> None:
    """Raise :class:`~tokenstate.contracts.ContractViolation` on the first broken invariant."""
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
    # Device state is written on the runner's stream: wait for the in-flight work (a verifier may
    # give up the overlap) so the reads below see every reseed and history write submitted so far.
    runner.stream.synchronize()
    history = runner.mirror.history
    device_prefill = runner.mirror.prefill_len
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
        device = history[req.slot, : known.shape[0]].cpu().numpy()  # [num_known] int32
        wrong = np.flatnonzero(device != known)
        if wrong.size:
            p = int(wrong[0])
            _fail(
                f"device token history of slot {req.slot} (request {req.request_id}) holds "
                f"{int(device[p])} at position {p} where the request has {int(known[p])}"
            )
        if int(device_prefill[req.slot]) != req.prefill_len:
            _fail(
                f"device prefill_len of slot {req.slot} is {int(device_prefill[req.slot])}, request "
                f"{req.request_id} was admitted with {req.prefill_len}"
            )
