"""Triton post-update and draft verification kernels (see :mod:`.post_update` for semantics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["launch_post_update", "launch_verify_drafts"]


@triton.jit
def _post_update_kernel(
    sampled_ptr,  # [num_logits] int32/int64
    cu_num_logits_ptr,  # [num_rows + 1] int32
    num_sampled_ptr,  # [num_rows] int32
    keep_ptr,  # [num_rows] int8 (bool)
    query_start_loc_ptr,  # [num_rows + 1] int32
    num_drafts_ptr,  # [num_rows] int32
    slots_ptr,  # [num_rows] int32
    last_sampled_ptr,  # [num_slots] int32, in/out
    num_computed_ptr,  # [num_slots] int32, in/out
):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    keep = tl.load(keep_ptr + row) != 0
    num_sampled = tl.load(num_sampled_ptr + row)
    query_len = tl.load(query_start_loc_ptr + row + 1) - tl.load(query_start_loc_ptr + row)
    num_drafts = tl.load(num_drafts_ptr + row)
    first_logit = tl.load(cu_num_logits_ptr + row)
    token = tl.load(sampled_ptr + first_logit + num_sampled - 1, mask=keep, other=0)
    tl.store(last_sampled_ptr + slot, token.to(tl.int32), mask=keep)
    accepted_drafts = tl.where(keep, num_sampled - 1, 0)
    computed = tl.load(num_computed_ptr + slot)
    tl.store(num_computed_ptr + slot, computed + query_len - num_drafts + accepted_drafts)


@triton.jit
def _verify_drafts_kernel(
    target_ptr,  # [num_logits] int32/int64
    cu_num_logits_ptr,  # [num_rows + 1] int32
    slots_ptr,  # [num_rows] int32
    draft_tokens_ptr,  # [num_slots, max_drafts] int32
    draft_stride,
    num_drafts_ptr,  # [num_rows] int32
    num_sampled_ptr,  # [num_rows] int32, out
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    num_drafts = tl.load(num_drafts_ptr + row)
    first_logit = tl.load(cu_num_logits_ptr + row)
    end_logit = tl.load(cu_num_logits_ptr + row + 1)
    j = tl.arange(0, BLOCK_D)
    in_draft = j < num_drafts
    draft = tl.load(draft_tokens_ptr + slot * draft_stride + j, mask=in_draft, other=0)
    target = tl.load(target_ptr + first_logit + j, mask=in_draft, other=0)
    # The first rejected draft's index, or num_drafts when every draft matched.
    accepted = tl.min(tl.where(in_draft & (draft != target), j, num_drafts), axis=0)
    tl.store(num_sampled_ptr + row, tl.where(end_logit > first_logit, 1 + accepted, 0))


def launch_post_update(
    sampled: torch.Tensor,  # [num_logits] int32/int64
    cu_num_logits: torch.Tensor,  # [num_rows + 1] int32
    num_sampled: torch.Tensor,  # [num_rows] int32
    keep: torch.Tensor,  # [num_rows] bool
    query_start_loc: torch.Tensor,  # [num_rows + 1] int32
    num_drafts: torch.Tensor,  # [num_rows] int32
    slots: torch.Tensor,  # [num_rows] int32
    last_sampled: torch.Tensor,  # [num_slots] int32, in/out
    num_computed: torch.Tensor,  # [num_slots] int32, in/out
) -> None:
    num_rows = slots.shape[0]
    if num_rows == 0:
        return
    # An empty sampled tensor has no address; every row is then discarded and never reads it.
    sampled_or_dummy = sampled if sampled.numel() else num_sampled
    _post_update_kernel[(num_rows,)](
        sampled_or_dummy, cu_num_logits, num_sampled, keep.view(torch.int8), query_start_loc,
        num_drafts, slots, last_sampled, num_computed,
    )  # fmt: skip


def launch_verify_drafts(
    target: torch.Tensor,  # [num_logits] int32/int64
    cu_num_logits: torch.Tensor,  # [num_rows + 1] int32
    slots: torch.Tensor,  # [num_rows] int32
    draft_tokens: torch.Tensor,  # [num_slots, max_drafts] int32
    num_drafts: torch.Tensor,  # [num_rows] int32
    num_sampled: torch.Tensor,  # [num_rows] int32, out
) -> None:
    num_rows = slots.shape[0]
    if num_rows == 0:
        return
    max_drafts = draft_tokens.shape[1]
    # Empty tensors have no address; with no drafts / no logits the kernel never reads them.
    drafts = draft_tokens if draft_tokens.numel() else num_drafts
    targets = target if target.numel() else num_drafts
    _verify_drafts_kernel[(num_rows,)](
        targets, cu_num_logits, slots, drafts, max(max_drafts, 1), num_drafts, num_sampled,
        BLOCK_D=triton.next_power_of_2(max(max_drafts, 1)),
    )  # fmt: skip
