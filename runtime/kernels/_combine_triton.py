"""Triton combine kernel (imported only when launched; see :mod:`.combine` for the semantics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["launch_combine"]

_TOKEN_BLOCK = 128  # tokens copied per loop iteration; prefill rows loop, decode rows take one


@triton.jit
def _combine_kernel(
    host_ids_ptr,  # [num_tokens] int32
    query_start_loc_ptr,  # [num_rows + 1] int32
    seq_lens_ptr,  # [num_rows] int32
    slots_ptr,  # [num_rows] int32
    num_drafts_ptr,  # [num_rows] int32
    prefill_len_ptr,  # [num_slots] int32
    last_sampled_ptr,  # [num_slots] int32
    draft_tokens_ptr,  # [num_slots, max_drafts] int32
    draft_stride,
    cu_num_logits_ptr,  # [num_rows + 1] int32
    input_ids_ptr,  # [num_tokens] int32, out
    logits_indices_ptr,  # [num_logits] int64, out
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + row)
    end = tl.load(query_start_loc_ptr + row + 1)
    seq_len = tl.load(seq_lens_ptr + row)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    num_drafts = tl.load(num_drafts_ptr + row)
    prefill_len = tl.load(prefill_len_ptr + slot)
    # The kernel's copy of THE row predicate (tokenstate.contracts.spliced_rows); tests pin it.
    spliced = seq_len > prefill_len
    last_sampled = tl.load(last_sampled_ptr + slot)
    # Position tail_start + k of a spliced row takes the slot's k-th tail token: the last sampled
    # token for k == 0, draft k - 1 after it.
    tail_start = end - 1 - num_drafts
    for block_start in range(start, end, BLOCK):
        pos = block_start + tl.arange(0, BLOCK)
        in_row = pos < end
        k = pos - tail_start
        # tl.where, not `&`, joins the scalar `spliced` with a block: triton 3.9's interpreter
        # rejects the mask dtype that `block & scalar_bool` produces.
        stale = tl.where(spliced, in_row & (k >= 0), False)
        host = tl.load(host_ids_ptr + pos, mask=tl.where(stale, False, in_row), other=0)
        draft = tl.load(
            draft_tokens_ptr + slot * draft_stride + (k - 1), mask=stale & (k >= 1), other=0
        )
        spliced_value = tl.where(k == 0, last_sampled, draft)
        tl.store(input_ids_ptr + pos, tl.where(stale, spliced_value, host), mask=in_row)
    # A row's logits are its last (cu[r + 1] - cu[r]) positions.
    first_logit = tl.load(cu_num_logits_ptr + row)
    end_logit = tl.load(cu_num_logits_ptr + row + 1)
    for block_start in range(first_logit, end_logit, BLOCK):
        j = block_start + tl.arange(0, BLOCK)
        tl.store(logits_indices_ptr + j, (end - end_logit + j).to(tl.int64), mask=j < end_logit)


def launch_combine(
    host_ids: torch.Tensor,  # [num_tokens] int32
    query_start_loc: torch.Tensor,  # [num_rows + 1] int32
    seq_lens: torch.Tensor,  # [num_rows] int32
    slots: torch.Tensor,  # [num_rows] int32
    num_drafts: torch.Tensor,  # [num_rows] int32
    prefill_len: torch.Tensor,  # [num_slots] int32
    last_sampled: torch.Tensor,  # [num_slots] int32
    draft_tokens: torch.Tensor,  # [num_slots, max_drafts] int32
    cu_num_logits: torch.Tensor,  # [num_rows + 1] int32
    input_ids: torch.Tensor,  # [num_tokens] int32, out
    logits_indices: torch.Tensor,  # [num_logits] int64, out
) -> None:
    num_rows = seq_lens.shape[0]
    if num_rows == 0:
        return
    # A [num_slots, 0] draft table has no valid address; the kernel never reads it then.
    drafts = draft_tokens if draft_tokens.numel() else last_sampled
    _combine_kernel[(num_rows,)](
        host_ids,
        query_start_loc,
        seq_lens,
        slots,
        num_drafts,
        prefill_len,
        last_sampled,
        drafts,
        max(draft_tokens.shape[1], 1),
        cu_num_logits,
        input_ids,
        logits_indices,
        BLOCK=_TOKEN_BLOCK,
    )
