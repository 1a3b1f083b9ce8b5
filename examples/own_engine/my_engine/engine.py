"""A greedy engine loop with async-style scheduling, built on tokenstate's type states only.

Step N+1 is prepared before step N's sampled token is "copied to the host": the host buffer holds
``PLACEHOLDER`` at each decode row's position and the real id is spliced in on the device side from
``last_sampled`` — exactly the situation the contract covers. The engine builds ``HostTokens`` with
the stale mask from tokenstate's row predicate and ``DeviceTokens`` from its own combine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    stale_position_mask,
)


def generate(
    forward: Callable[..., torch.Tensor],
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_tokens: int,
    *,
    async_scheduling: bool = True,
) -> list[list[int]]:
    """Greedy-decode every prompt (one slot each) for ``max_tokens`` steps after its prefill.

    ``async_scheduling=False`` is the reference: the host learns each sampled token before the
    next step is prepared, so every input id is fresh on the host.
    """
    slots = list(range(len(prompts)))
    for slot in slots:
        model.reset_slot(slot)
    prefill_lens = [len(p) for p in prompts]
    known = [list(p) for p in prompts]  # what the host knows, per slot
    outputs: list[list[int]] = [[] for _ in prompts]
    last_sampled = torch.zeros(len(prompts), dtype=torch.int32)  # [num_slots] "device" state
    computed = [0] * len(prompts)
    pending: torch.Tensor | None = None  # sampled ids the host has not been told yet
    for _ in range(max_tokens + 1):
        host_ids, query_lens, seq_lens = [], [], []
        for slot in slots:
            if computed[slot] == 0:  # prefill the whole prompt
                host_ids += known[slot]
                query_lens.append(len(known[slot]))
            elif async_scheduling:  # decode: the input token is still on the "device"
                host_ids.append(PLACEHOLDER)
                query_lens.append(1)
            else:  # decode, synchronous: the host already holds the token sampled last step
                host_ids.append(known[slot][-1])
                query_lens.append(1)
            seq_lens.append(computed[slot] + query_lens[-1])
        qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)  # [num_rows]
        slot_t = torch.tensor(slots, dtype=torch.int32)  # [num_rows]
        # What the host knows when the step is prepared: async, only the prompt; sync, everything.
        host_known = prefill_lens if async_scheduling else [len(k) for k in known]
        stale = stale_position_mask(qsl, seq, torch.tensor(host_known, dtype=torch.int32))
        host = HostTokens(torch.tensor(host_ids, dtype=torch.int32), stale, qsl, slot_t)
        combined = host.placeholder_buffer().clone()  # [num_tokens] the engine's own combine
        combined[stale] = last_sampled[slot_t[_rows_of_stale(qsl, stale)]]
        logits_indices = (qsl[1:] - 1).long()  # [num_rows] last position of each row
        inp = ForwardInput(
            host_tokens=host,
            device_tokens=DeviceTokens.from_combine(combined, vocab_size=model.vocab_size)
            if host.has_stale
            else None,
            positions=torch.cat([torch.arange(c, s) for c, s in zip(computed, seq_lens, strict=True)]),
            layout=BatchLayout(qsl, seq, slot_t, torch.zeros(len(slots), dtype=torch.int32), logits_indices),
            logits_indices=logits_indices,
            slots=slot_t.long(),
        )
        sampled = forward(model, inp).argmax(-1).to(torch.int32)  # [num_rows]
        if pending is not None:  # the previous step's tokens reach the host one step late
            for slot, token in zip(slots, pending.tolist(), strict=True):
                known[slot].append(token)
        last_sampled[slot_t] = sampled
        pending = sampled.clone()
        if not async_scheduling:  # synchronous: the host waits for this step's tokens now
            for slot, token in zip(slots, pending.tolist(), strict=True):
                known[slot].append(token)
            pending = None
        for slot in slots:
            computed[slot] = seq_lens[slot]
            outputs[slot].append(int(sampled[slot]))
    return [out[:max_tokens] for out in outputs]


def _rows_of_stale(qsl: torch.Tensor, stale: torch.Tensor) -> torch.Tensor:
    """Row index of every stale position (``[num_stale]`` int64)."""
    positions = stale.nonzero().flatten()  # [num_stale]
    return torch.searchsorted(qsl[1:].long(), positions, right=True)
