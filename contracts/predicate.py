"""The row predicate: the one Python definition of which token positions are *spliced*.

A batch row for a slot covers positions ``[num_computed, num_computed + query_len)`` with
``seq_len = num_computed + query_len``. The row is spliced iff ``seq_len`` exceeds ``prefill_len``: its last
input position holds a token that was sampled on the device and that the host has not been told.
The row's draft-token positions (its last ``num_drafts`` positions) are spliced too, so a spliced
row's stale positions are its last ``1 + num_drafts`` positions. The chunk that completes a prefill
has ``seq_len == prefill_len`` and is not spliced.

Every other copy (the Triton combine kernel, its torch twin, the routing checker's tests) is pinned
to :func:`spliced_rows` by tests; nothing else in the code base restates the comparison.
"""

from __future__ import annotations

import numpy as np
import torch

from tokenstate.contracts.errors import ContractViolation

__all__ = ["spliced_rows", "stale_position_mask"]


def spliced_rows(seq_lens: torch.Tensor, prefill_lens: torch.Tensor) -> torch.Tensor:
    """Per-row spliced flag: ``seq_lens`` exceeds ``prefill_lens`` — THE row predicate.

    Args:
        seq_lens: ``[num_rows]`` integer, ``num_computed + query_len`` per row.
        prefill_lens: ``[num_rows]`` integer, tokens the host knew when the row's request was
            admitted to its slot (gathered per row from the slot-indexed value).

    Returns:
        ``[num_rows]`` bool.
    """
    if seq_lens.shape != prefill_lens.shape or seq_lens.dim() != 1:
        raise ContractViolation(
            "spliced_rows: seq_lens and prefill_lens must both be [num_rows]; got "
            f"{tuple(seq_lens.shape)} and {tuple(prefill_lens.shape)}. Gather prefill_len by slot "
            "for each row before calling."
        )
    return seq_lens > prefill_lens


def stale_position_mask(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_lens: torch.Tensor,
    num_drafts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-position stale mask: the last ``1 + num_drafts`` positions of every spliced row.

    Args:
        query_start_loc: ``[num_rows + 1]`` integer, flat start of each row's query (cumulative).
        seq_lens: ``[num_rows]`` integer.
        prefill_lens: ``[num_rows]`` integer.
        num_drafts: ``[num_rows]`` integer draft-token count per row, or ``None`` for no drafts.

    Returns:
        ``[num_tokens]`` bool where ``num_tokens = query_start_loc[-1]``.
    """
    num_rows = seq_lens.shape[0]
    if query_start_loc.shape != (num_rows + 1,):
        raise ContractViolation(
            f"stale_position_mask: query_start_loc must be [num_rows + 1] = [{num_rows + 1}], got "
            f"{tuple(query_start_loc.shape)}."
        )
    if num_drafts is None:
        num_drafts = torch.zeros_like(seq_lens)
    spliced = spliced_rows(seq_lens, prefill_lens)  # [num_rows] bool
    if seq_lens.device.type == "cpu":
        return _mask_on_host(query_start_loc, spliced, num_drafts)
    query_lens = query_start_loc[1:] - query_start_loc[:-1]  # [num_rows]
    # Stale tail length per row: 1 + drafts for spliced rows, 0 otherwise (clipped to the query so
    # an empty row never reaches into its neighbour).
    tail = torch.where(spliced, torch.minimum(1 + num_drafts, query_lens), torch.zeros_like(query_lens))
    num_tokens = int(query_start_loc[-1])
    row_of_token = torch.repeat_interleave(
        torch.arange(num_rows, device=seq_lens.device), query_lens.to(torch.long), output_size=num_tokens
    )  # [num_tokens]
    token_index = torch.arange(num_tokens, device=seq_lens.device)  # [num_tokens]
    row_end = query_start_loc[1:].to(torch.long)[row_of_token]  # [num_tokens]
    return token_index >= row_end - tail.to(torch.long)[row_of_token]


def _mask_on_host(
    query_start_loc: torch.Tensor, spliced: torch.Tensor, num_drafts: torch.Tensor
) -> torch.Tensor:
    """The same mask for CPU tensors, in numpy: runs once per async step, so it must cost µs.

    Each spliced row marks the interval ``[end - tail, end)``; rows never overlap, so +1 at every
    interval start, -1 at every end and a running sum mark exactly the stale positions (torch's
    CPU ``repeat_interleave`` and fancy indexing spin up a thread pool per call instead).
    """
    qsl = query_start_loc.numpy().astype(np.int64)  # [num_rows + 1]
    ends = qsl[1:]  # [num_rows]
    tail = np.minimum(1 + num_drafts.numpy().astype(np.int64), ends - qsl[:-1])  # [num_rows]
    keep = spliced.numpy() & (tail > 0)  # [num_rows] rows that own a non-empty stale tail
    num_tokens = int(qsl[-1])
    edges = np.bincount(ends[keep] - tail[keep], minlength=num_tokens + 1)  # [num_tokens + 1]
    edges[: num_tokens + 1] -= np.bincount(ends[keep], minlength=num_tokens + 1)
    return torch.from_numpy(np.cumsum(edges[:num_tokens]) > 0)
