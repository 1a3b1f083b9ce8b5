"""Numpy twins of combine and post-update, for the CPU mirror (``backend="auto"`` on the CPU).

On the CPU the "device" tensors are host memory, and a step's combine and post-update work on a few
dozen ints: there a torch op costs its dispatch (µs), a numpy op a fraction of that. These twins
read and write the very same tensors through ``Tensor.numpy()`` views (shared memory, no copy), so
they have exactly the effect of the torch twins — the kernel tests compare all of them.

The arguments are already checked by the public launchers (dtypes, shapes, contiguity, device).
The row predicate is still evaluated by :func:`tokenstate.contracts.spliced_rows` itself.
"""

from __future__ import annotations

import numpy as np
import torch

from tokenstate.contracts import spliced_rows

__all__ = ["combine_host", "post_update_host"]


def combine_host(
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
    """Numpy twin of :func:`~tokenstate.runtime.kernels.combine` for CPU tensors (same results)."""
    slot_rows = slots.numpy()  # [num_rows] int32
    # ``take``: numpy's cheapest gather for a few dozen ints (fancy indexing costs twice as much).
    spliced = spliced_rows(seq_lens.numpy(), prefill_len.numpy().take(slot_rows))  # [num_rows] bool
    qsl = query_start_loc.numpy()  # [num_rows + 1] int32
    row_start, row_end = qsl[:-1], qsl[1:]  # [num_rows] each
    ids = host_ids.numpy().copy()  # [num_tokens] int32
    if draft_tokens.shape[1] == 0:
        write = spliced & (row_end > row_start)  # [num_rows] bool: a spliced row with a query
        ids[row_end[write] - 1] = last_sampled.numpy().take(slot_rows[write])
    else:
        drafts = num_drafts.numpy()  # [num_rows] int32
        tail_k = np.arange(1 + draft_tokens.shape[1])  # [1 + max_drafts]
        tail_pos = (row_end - 1 - drafts)[:, None] + tail_k  # [num_rows, 1 + max_drafts]
        write = spliced[:, None] & (tail_k <= drafts[:, None]) & (tail_pos >= row_start[:, None])
        tail_tokens = np.concatenate(
            (last_sampled.numpy()[slot_rows, None], draft_tokens.numpy()[slot_rows]), axis=1
        )  # [num_rows, 1 + max_drafts] int32
        ids[tail_pos[write]] = tail_tokens[write]

    if num_logits == ids.shape[0]:
        # Every position is a logit (all-decode steps): no row has more logits than positions, so
        # equal totals mean equal rows.
        logits_indices = np.arange(num_logits, dtype=np.int64)  # [num_logits]
    else:
        cu = cu_num_logits.numpy()  # [num_rows + 1] int32
        # Row r's logits are its last n_r positions: logit i of row r sits at i + (end_r - cu[r + 1]).
        shift = np.repeat(row_end - cu[1:], cu[1:] - cu[:-1])  # [num_logits]
        logits_indices = np.arange(num_logits, dtype=np.int64) + shift  # [num_logits]
    return torch.from_numpy(ids), torch.from_numpy(logits_indices)


def post_update_host(
    sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    keep: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_drafts: torch.Tensor,
    slots: torch.Tensor,
    last_sampled: torch.Tensor,
    num_computed: torch.Tensor,
) -> None:
    """Numpy twin of :func:`~tokenstate.runtime.kernels.post_update` for CPU tensors (same effect)."""
    qsl, keep_rows = query_start_loc.numpy(), keep.numpy()  # [num_rows + 1] int32, [num_rows] bool
    emitted_count = num_sampled.numpy()  # [num_rows] int32
    slot_rows = slots.numpy()  # [num_rows] int32
    accepted_drafts = np.where(keep_rows, emitted_count - 1, 0)  # [num_rows]
    advance = (qsl[1:] - qsl[:-1] - num_drafts.numpy() + accepted_drafts).astype(np.int32)
    np.add.at(num_computed.numpy(), slot_rows, advance)  # accumulates like index_add_
    if sampled.numel() == 0:  # no logits: every row is discarded, nothing to scatter
        return
    kept = np.flatnonzero(keep_rows)  # [num_kept] rows whose sample is emitted
    pick = cu_num_logits.numpy()[kept] + emitted_count[kept] - 1  # [num_kept]
    last_sampled.numpy()[slot_rows[kept]] = sampled.numpy()[pick]  # discarded rows stay unchanged
