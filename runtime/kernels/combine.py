"""Combine: splice the device-side sampled and draft tokens into the step's input ids.

On the async path the uploaded host buffer holds ``PLACEHOLDER`` at every spliced position. For each
row that the row predicate (:func:`tokenstate.contracts.spliced_rows`: ``seq_len`` exceeds ``prefill_len``)
marks spliced, combine writes the slot's last sampled token at position ``end - 1 - num_drafts`` and
the slot's draft tokens at the row's last ``num_drafts`` positions; every other position is copied
from the host buffer. Exactly the positions :func:`tokenstate.contracts.stale_position_mask` marks
are replaced (a row shorter than its tail only has its last ``query_len`` tail tokens written).

It also produces the logits indices: row ``r`` contributes ``n_r = cu_num_logits[r + 1] -
cu_num_logits[r]`` logits, at its last ``n_r`` positions (``1 + num_drafts`` for a sampled row with
drafts, ``0`` for a row whose sample is not needed).
"""

from __future__ import annotations

import torch

from tokenstate.contracts import ContractViolation, spliced_rows
from tokenstate.runtime.kernels._launch import (
    check_index_range,
    require_tensor,
    same_device,
    triton_impl,
    use_triton,
)
from tokenstate.runtime.kernels.host_twins import combine_host

__all__ = ["combine", "combine_twin"]

_I32 = (torch.int32,)


def combine(
    host_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slots: torch.Tensor,
    num_drafts: torch.Tensor,
    prefill_len: torch.Tensor,
    last_sampled: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    *,
    num_logits: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build the step's authoritative input ids and its logits indices.

    All tensors are int32, contiguous and on the execution device.

    Args:
        host_ids: ``[num_tokens]`` the uploaded host buffer (``PLACEHOLDER`` at stale positions).
        query_start_loc: ``[num_rows + 1]`` flat start of each row's query.
        seq_lens: ``[num_rows]`` ``num_computed + query_len`` per row.
        slots: ``[num_rows]`` persistent slot of each row (distinct).
        num_drafts: ``[num_rows]`` draft tokens at the end of each row, ``<= max_drafts``.
        prefill_len: ``[num_slots]`` tokens the host knew when the slot's request was admitted.
        last_sampled: ``[num_slots]`` last token sampled for each slot.
        draft_tokens: ``[num_slots, max_drafts]`` proposed drafts per slot (``max_drafts`` may be 0).
        cu_num_logits: ``[num_rows + 1]`` cumulative logits count; row ``r``'s ``n_r`` logits are
            its last ``n_r <= query_len`` positions.
        num_logits: ``cu_num_logits[-1]`` as known on the host. Pass it on CUDA: reading it from
            the tensor is a host sync.
        backend: ``"auto"`` (Triton on CUDA, the numpy twin on the CPU), ``"triton"`` or
            ``"torch"`` (the torch twin).
        validate: check every argument's metadata first (the default). ``False`` skips the checks,
            for a caller whose buffers are right by construction: the model runner passes its
            mirror's views, and validates only in ``full`` checks mode, where these checks cost
            about as much as the CPU twin itself.

    Returns:
        ``input_ids`` ``[num_tokens]`` int32 and ``logits_indices`` ``[num_logits]`` int64.

    Raises:
        ContractViolation: an argument has the wrong dtype, shape, layout or device (or, in ``full``
            checks mode on the CPU, a slot or draft count out of range).
    """
    if validate:
        fn = "combine"
        require_tensor(fn, "host_ids", host_ids, dtypes=_I32, shape=[None])
        num_rows = require_tensor(fn, "seq_lens", seq_lens, dtypes=_I32, shape=[None]).shape[0]
        require_tensor(fn, "query_start_loc", query_start_loc, dtypes=_I32, shape=[num_rows + 1])
        require_tensor(fn, "slots", slots, dtypes=_I32, shape=[num_rows])
        require_tensor(fn, "num_drafts", num_drafts, dtypes=_I32, shape=[num_rows])
        num_slots = require_tensor(fn, "prefill_len", prefill_len, dtypes=_I32, shape=[None]).shape[0]
        require_tensor(fn, "last_sampled", last_sampled, dtypes=_I32, shape=[num_slots])
        require_tensor(fn, "draft_tokens", draft_tokens, dtypes=_I32, shape=[num_slots, None])
        require_tensor(fn, "cu_num_logits", cu_num_logits, dtypes=_I32, shape=[num_rows + 1])
        device = same_device(
            fn,
            {
                "host_ids": host_ids,
                "query_start_loc": query_start_loc,
                "seq_lens": seq_lens,
                "slots": slots,
                "num_drafts": num_drafts,
                "prefill_len": prefill_len,
                "last_sampled": last_sampled,
                "draft_tokens": draft_tokens,
                "cu_num_logits": cu_num_logits,
            },
        )
        check_index_range(fn, "slots", slots, num_slots)
        check_index_range(fn, "num_drafts", num_drafts, draft_tokens.shape[1] + 1)
    else:
        device = host_ids.device
    if num_logits is None:
        num_logits = int(cu_num_logits[-1])
    elif num_logits < 0:
        raise ContractViolation(f"combine: num_logits must be >= 0, got {num_logits}.")
    if not use_triton("combine", backend, device):
        twin = combine_host if backend == "auto" and device.type == "cpu" else combine_twin
        return twin(
            host_ids, query_start_loc, seq_lens, slots, num_drafts, prefill_len, last_sampled,
            draft_tokens, cu_num_logits, num_logits=num_logits,
        )  # fmt: skip
    input_ids = torch.empty(host_ids.shape[0], dtype=torch.int32, device=device)  # [num_tokens] int32
    logits_indices = torch.empty(num_logits, dtype=torch.int64, device=device)  # [num_logits] int64
    triton_impl("_combine_triton").launch_combine(
        host_ids, query_start_loc, seq_lens, slots, num_drafts, prefill_len, last_sampled,
        draft_tokens, cu_num_logits, input_ids, logits_indices,
    )  # fmt: skip
    return input_ids, logits_indices


def combine_twin(
    host_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slots: torch.Tensor,
    num_drafts: torch.Tensor,
    prefill_len: torch.Tensor,
    last_sampled: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    *,
    num_logits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`combine` (same arguments, already checked; same results).

    Vectorised over a ``[num_rows, 1 + max_drafts]`` grid of tail positions, so its cost does not
    grow with prefill lengths and has no per-row Python loop: it runs on every async decode step.
    """
    num_tokens = host_ids.shape[0]
    device = host_ids.device
    row_start, row_end = query_start_loc[:-1], query_start_loc[1:]  # [num_rows] int32 each
    spliced = spliced_rows(seq_lens, prefill_len.index_select(0, slots))  # [num_rows] bool
    last_tokens = last_sampled.index_select(0, slots)  # [num_rows] int32
    if draft_tokens.shape[1] == 0:
        # Plain decode (no draft table): one tail position per row, no [rows, tail] grid to build.
        tail_pos = row_end - 1  # [num_rows] int32
        write = spliced & (tail_pos >= row_start)  # [num_rows] bool
        tail_tokens = last_tokens  # [num_rows] int32
    else:
        tail_k = torch.arange(1 + draft_tokens.shape[1], dtype=torch.int32, device=device)
        tail_pos = (row_end - 1 - num_drafts).unsqueeze(1) + tail_k  # [num_rows, 1 + max_drafts]
        write = (
            spliced.unsqueeze(1)
            & (tail_k <= num_drafts.unsqueeze(1))
            & (tail_pos >= row_start.unsqueeze(1))
        )  # [num_rows, 1 + max_drafts] bool
        tail_tokens = torch.cat(
            (last_tokens.unsqueeze(1), draft_tokens.index_select(0, slots)), dim=1
        )  # [num_rows, 1 + max_drafts] int32
    # Positions that are not written are sent to one scratch element past the end, so a single
    # scatter without a data-dependent (syncing) boolean index does the whole splice.
    input_ids = torch.empty(num_tokens + 1, dtype=torch.int32, device=device)  # [num_tokens + 1]
    input_ids[:num_tokens] = host_ids
    target = torch.where(write, tail_pos, num_tokens).flatten().long()  # [num_rows * tail] int64
    input_ids.scatter_(0, target, tail_tokens.flatten())

    if device.type == "cpu" and torch.equal(cu_num_logits, query_start_loc):
        # Every row samples every query position (all-decode steps): the logits are all positions.
        # Only on the CPU, where comparing values is not a device sync.
        return input_ids[:num_tokens], torch.arange(num_logits, device=device)
    # logits_indices[cu[r] + j] = end_r - n_r + j = (cu[r] + j) + (end_r - cu[r + 1]); the row of
    # each logit is found by binary search in cu (cheaper on the CPU than a repeat_interleave).
    cu_end = cu_num_logits[1:]  # [num_rows] int32
    logit_ids = torch.arange(num_logits, dtype=torch.int32, device=device)  # [num_logits] int32
    logit_row = torch.searchsorted(cu_end, logit_ids, right=True)  # [num_logits] int64
    logits_indices = (
        logit_ids + (row_end - cu_end).index_select(0, logit_row)
    ).long()  # [num_logits]
    return input_ids[:num_tokens], logits_indices
