"""Triton guarded embedding gather (imported only when launched; see :mod:`.embedding`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["launch_guarded_embedding"]


@triton.jit
def _guarded_embedding_kernel(
    ids_ptr,  # [num_tokens] int32/int64
    weight_ptr,  # [vocab, hidden] float
    out_ptr,  # [num_tokens, hidden] float, out
    bad_ptr,  # [num_tokens] int8, out
    vocab_size,
    hidden,
    BLOCK_H: tl.constexpr,
):
    pos = tl.program_id(0).to(tl.int64)
    hidden_block = tl.program_id(1)
    token = tl.load(ids_ptr + pos).to(tl.int64)
    bad = (token < 0) | (token >= vocab_size)
    cols = hidden_block * BLOCK_H + tl.arange(0, BLOCK_H)
    in_hidden = cols < hidden
    # A bad id's address is never formed into a load: the mask keeps it off memory entirely.
    # (tl.where joins the scalar flag with the block: the interpreter rejects `block & scalar`.)
    row = tl.load(
        weight_ptr + token * hidden + cols, mask=tl.where(bad, False, in_hidden), other=0.0
    )
    tl.store(out_ptr + pos * hidden + cols, row, mask=in_hidden)
    if hidden_block == 0:
        tl.store(bad_ptr + pos, bad.to(tl.int8))


def launch_guarded_embedding(
    ids: torch.Tensor,  # [num_tokens] int32/int64
    weight: torch.Tensor,  # [vocab, hidden] float
    out: torch.Tensor,  # [num_tokens, hidden] float, out
    bad: torch.Tensor,  # [num_tokens] int8, out
) -> None:
    num_tokens = ids.shape[0]
    vocab_size, hidden = weight.shape
    if num_tokens == 0:
        return
    block_h = min(triton.next_power_of_2(max(hidden, 1)), 1024)
    grid = (num_tokens, max(triton.cdiv(hidden, block_h), 1))  # one block still writes the flags
    _guarded_embedding_kernel[grid](ids, weight, out, bad, vocab_size, hidden, BLOCK_H=block_h)
