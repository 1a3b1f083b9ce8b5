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

# Row metadata: torch tensors (any device) or, on the host, numpy arrays.
IntVector = torch.Tensor | np.ndarray
BoolVector = torch.Tensor | np.ndarray  # a bool mask, of the kind of the row metadata it came from


def spliced_rows(seq_lens: IntVector, prefill_lens: IntVector) -> BoolVector:
    """Per-row spliced flag: ``seq_lens`` exceeds ``prefill_lens`` — THE row predicate.

    Args:
        seq_lens: ``[num_rows]`` integer, ``num_computed + query_len`` per row.
        prefill_lens: ``[num_rows]`` integer, tokens the host knew when the row's request was
            admitted to its slot (gathered per row from the slot-indexed value).

    Both are torch tensors or both numpy arrays (the host's input preparation and the CPU twins
    evaluate the predicate in numpy, where an op costs a fraction of a torch dispatch).

    Returns:
        ``[num_rows]`` bool, of the inputs' kind.
    """
    if (
        seq_lens.shape != prefill_lens.shape
        or len(seq_lens.shape) != 1
        or type(seq_lens) is not type(prefill_lens)
    ):
        raise ContractViolation(
            "spliced_rows: seq_lens and prefill_lens must both be [num_rows], of one kind (torch "
            f"tensors or numpy arrays); got {type(seq_lens).__name__} {tuple(seq_lens.shape)} and "
            f"{type(prefill_lens).__name__} {tuple(prefill_lens.shape)}. Gather prefill_len by slot "
            "for each row before calling."
        )
    return seq_lens > prefill_lens


def stale_position_mask(
    query_start_loc: IntVector,
    seq_lens: IntVector,
    prefill_lens: IntVector,
    num_drafts: IntVector | None = None,
) -> BoolVector:
    """Per-position stale mask: the last ``1 + num_drafts`` positions of every spliced row.

    Args:
        query_start_loc: ``[num_rows + 1]`` integer, flat start of each row's query (cumulative).
        seq_lens: ``[num_rows]`` integer.
        prefill_lens: ``[num_rows]`` integer.
        num_drafts: ``[num_rows]`` integer draft-token count per row, or ``None`` for no drafts.

    All torch tensors on one device, or all numpy arrays.

    Returns:
        ``[num_tokens]`` bool where ``num_tokens = query_start_loc[-1]``, of the inputs' kind.
    """
    num_rows = seq_lens.shape[0]
    if tuple(query_start_loc.shape) != (num_rows + 1,):
        raise ContractViolation(
            f"stale_position_mask: query_start_loc must be [num_rows + 1] = [{num_rows + 1}], got "
            f"{tuple(query_start_loc.shape)}."
        )
    kind = type(seq_lens)
    if type(query_start_loc) is not kind or (num_drafts is not None and type(num_drafts) is not kind):
        raise ContractViolation(
            "stale_position_mask: pass every argument as a torch tensor or every one as a numpy "
            f"array; got query_start_loc {type(query_start_loc).__name__}, seq_lens "
            f"{type(seq_lens).__name__}, num_drafts {type(num_drafts).__name__}."
        )
    spliced = spliced_rows(seq_lens, prefill_lens)  # [num_rows] bool
    if isinstance(seq_lens, np.ndarray):
        return _mask_in_numpy(query_start_loc, spliced, num_drafts)
    if seq_lens.device.type == "cpu":
        # numpy views of the same memory: a CPU torch op costs more than the whole numpy mask.
        drafts = None if num_drafts is None else num_drafts.numpy()
        return torch.from_numpy(_mask_in_numpy(query_start_loc.numpy(), spliced.numpy(), drafts))
    if num_drafts is None:
        num_drafts = torch.zeros_like(seq_lens)
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


def _mask_in_numpy(
    query_start_loc: np.ndarray, spliced: np.ndarray, num_drafts: np.ndarray | None
) -> np.ndarray:
    """The same mask in numpy: it runs once per async step, so it must cost a few µs.

    A row's stale positions are ``[end - tail, end)``, so a token is stale iff its flat index
    reaches its row's ``end - tail`` (a few vectorised ops; torch's CPU ``repeat_interleave`` and
    fancy indexing spin up a thread pool per call instead).
    """
    starts, ends = query_start_loc[:-1], query_start_loc[1:]  # [num_rows] each
    query_lens = ends - starts  # [num_rows]
    if query_start_loc[0] == 0 and not np.count_nonzero(query_lens != 1):
        # One token a row (a decode step): that token is a spliced row's whole stale tail, drafts
        # or not (the tail is clipped to the query), and no other token is stale.
        return spliced
    if query_start_loc[0] != 0 or np.count_nonzero(query_lens < 0):
        raise ContractViolation(
            "stale_position_mask: query_start_loc must rise from 0 (row r spans "
            f"[query_start_loc[r], query_start_loc[r + 1])); got {query_start_loc.tolist()}."
        )
    # Stale tail per row: 1 + drafts for a spliced row, clipped to its query; 0 for the others.
    tail = query_lens.clip(max=1) if num_drafts is None else np.minimum(num_drafts + 1, query_lens)
    first_stale = ends - tail * spliced  # [num_rows]: the row's end where nothing is stale
    threshold = np.repeat(first_stale, query_lens)  # [num_tokens]
    return np.arange(threshold.shape[0]) >= threshold
