"""Post-update after sampling: advance the slot-indexed mirror state, and verify drafts.

Row ``r`` (slot ``s = slots[r]``, ``q`` query tokens of which the last ``d = num_drafts[r]`` are
drafts, logits at flat ``cu_num_logits[r] .. cu_num_logits[r + 1] - 1``) emits
``num_sampled[r] = 1 + a`` tokens, where ``a`` drafts were accepted. :func:`post_update` then sets,
for a row whose sample is kept (``keep[r]``)::

    last_sampled[s]  = sampled[cu_num_logits[r] + num_sampled[r] - 1]   # the last emitted token
    num_computed[s] += q - d + (num_sampled[r] - 1)                      # rejected drafts not counted

and for a row whose sample is discarded (``keep[r]`` false: a prefill chunk that does not finish the
prompt) leaves ``last_sampled[s]`` alone and adds ``q - d``.

* Plain decode: ``num_drafts = 0``, one logit per row, ``num_sampled = 1`` → the sampled token
  becomes ``last_sampled``, ``num_computed += 1``.
* Speculative decoding: ``q = 1 + d``, ``1 + d`` logits, ``num_sampled`` from
  :func:`verify_drafts` → ``num_computed += 1 + a`` and ``last_sampled`` is the bonus/corrected
  token after the ``a`` accepted drafts.

Preconditions (metadata is checked; values only in ``full`` checks mode on the CPU, since reading a
device value is a host sync): slots are distinct and in range; a kept row has
``1 <= num_sampled[r] <= cu_num_logits[r + 1] - cu_num_logits[r]``.
"""

from __future__ import annotations

import torch

from tokenstate.contracts import ContractViolation, get_checks_mode
from tokenstate.runtime.kernels._launch import (
    check_index_range,
    require_tensor,
    same_device,
    triton_impl,
    use_triton,
)
from tokenstate.runtime.kernels.host_twins import post_update_host

__all__ = ["post_update", "post_update_twin", "verify_drafts", "verify_drafts_twin"]

_I32 = (torch.int32,)
_TOKENS = (torch.int32, torch.int64)


def post_update(
    sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    keep: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_drafts: torch.Tensor,
    slots: torch.Tensor,
    last_sampled: torch.Tensor,
    num_computed: torch.Tensor,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> None:
    """Scatter each kept row's last emitted token into ``last_sampled`` and advance ``num_computed``.

    Args:
        sampled: ``[num_logits]`` int32/int64, the token sampled at each logits position.
        cu_num_logits: ``[num_rows + 1]`` int32, as given to :func:`~.combine.combine`.
        num_sampled: ``[num_rows]`` int32, tokens the row emits (``1 + accepted drafts``).
        keep: ``[num_rows]`` bool, false for a row whose sample is discarded.
        query_start_loc: ``[num_rows + 1]`` int32.
        num_drafts: ``[num_rows]`` int32.
        slots: ``[num_rows]`` int32, distinct.
        last_sampled: ``[num_slots]`` int32, updated in place.
        num_computed: ``[num_slots]`` int32, updated in place.
        backend: ``"auto"`` (Triton on CUDA, the numpy twin on the CPU), ``"triton"`` or
            ``"torch"`` (the torch twin).
        validate: check every argument first (the default); ``False`` skips the checks, as for
            :func:`~.combine.combine` (the runner validates only in ``full`` checks mode).
    """
    if validate:
        fn = "post_update"
        require_tensor(fn, "sampled", sampled, dtypes=_TOKENS, shape=[None])
        num_rows = require_tensor(fn, "slots", slots, dtypes=_I32, shape=[None]).shape[0]
        require_tensor(fn, "cu_num_logits", cu_num_logits, dtypes=_I32, shape=[num_rows + 1])
        require_tensor(fn, "num_sampled", num_sampled, dtypes=_I32, shape=[num_rows])
        require_tensor(fn, "keep", keep, dtypes=(torch.bool,), shape=[num_rows])
        require_tensor(fn, "query_start_loc", query_start_loc, dtypes=_I32, shape=[num_rows + 1])
        require_tensor(fn, "num_drafts", num_drafts, dtypes=_I32, shape=[num_rows])
        num_slots = require_tensor(fn, "last_sampled", last_sampled, dtypes=_I32, shape=[None]).shape[0]
        require_tensor(fn, "num_computed", num_computed, dtypes=_I32, shape=[num_slots])
        device = same_device(
            fn,
            {
                "sampled": sampled,
                "cu_num_logits": cu_num_logits,
                "num_sampled": num_sampled,
                "keep": keep,
                "query_start_loc": query_start_loc,
                "num_drafts": num_drafts,
                "slots": slots,
                "last_sampled": last_sampled,
                "num_computed": num_computed,
            },
        )
        check_index_range(fn, "slots", slots, num_slots)
        if get_checks_mode() == "full" and device.type == "cpu":
            logits_per_row = cu_num_logits[1:] - cu_num_logits[:-1]  # [num_rows] int32
            wrong = keep & ((num_sampled < 1) | (num_sampled > logits_per_row))  # [num_rows] bool
            if bool(wrong.any()):
                rows = wrong.nonzero().flatten().tolist()
                raise ContractViolation(
                    f"{fn}: kept rows {rows} have num_sampled {num_sampled[rows].tolist()} outside "
                    f"[1, logits of the row] = {logits_per_row[rows].tolist()}; pass keep=False for "
                    "rows whose sample is discarded."
                )
    else:
        device = sampled.device
    if not use_triton("post_update", backend, device):
        twin = post_update_host if backend == "auto" and device.type == "cpu" else post_update_twin
        twin(
            sampled, cu_num_logits, num_sampled, keep, query_start_loc, num_drafts, slots,
            last_sampled, num_computed,
        )  # fmt: skip
        return
    triton_impl("_post_update_triton").launch_post_update(
        sampled, cu_num_logits, num_sampled, keep, query_start_loc, num_drafts, slots,
        last_sampled, num_computed,
    )  # fmt: skip


def post_update_twin(
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
    """Torch twin of :func:`post_update` (same arguments, already checked; same effect)."""
    query_lens = query_start_loc[1:] - query_start_loc[:-1]  # [num_rows] int32
    accepted_drafts = torch.where(keep, num_sampled - 1, 0)  # [num_rows] int32
    num_computed.index_add_(0, slots, query_lens - num_drafts + accepted_drafts)
    if sampled.numel() == 0:  # no logits: every row is discarded, nothing to scatter
        return
    # Discarded rows point at logit 0 and then write their slot's current value back unchanged.
    pick = torch.where(keep, cu_num_logits[:-1] + num_sampled - 1, 0)  # [num_rows] int32
    emitted = sampled.index_select(0, pick).to(torch.int32)  # [num_rows] int32
    current = last_sampled.index_select(0, slots)  # [num_rows] int32
    last_sampled.index_put_((slots,), torch.where(keep, emitted, current))


def verify_drafts(
    target: torch.Tensor,
    cu_num_logits: torch.Tensor,
    slots: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Draft verification: ``num_sampled[r] = 1 + longest prefix where draft == target``.

    Row ``r`` with ``d = num_drafts[r]`` drafts has ``1 + d`` logits; ``target[cu[r] + j]`` is the
    token the sampler drew from the row's ``j``-th logit of the tail (argmax for a greedy request,
    the seeded draw for a sampled one: see :mod:`tokenstate.runtime.spec_decode`), so draft ``j`` is
    accepted while ``draft_tokens[slots[r], j] == target[cu[r] + j]`` for all earlier ``j``. A row
    with no logits gets 0 (nothing emitted).

    Args:
        target: ``[num_logits]`` int32/int64 sampled tokens, one per logit.
        cu_num_logits: ``[num_rows + 1]`` int32.
        slots: ``[num_rows]`` int32.
        draft_tokens: ``[num_slots, max_drafts]`` int32, the drafts that combine spliced in.
        num_drafts: ``[num_rows]`` int32.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``.

    Returns:
        ``num_sampled`` ``[num_rows]`` int32, ready for :func:`post_update`.
    """
    fn = "verify_drafts"
    require_tensor(fn, "target", target, dtypes=_TOKENS, shape=[None])
    num_rows = require_tensor(fn, "slots", slots, dtypes=_I32, shape=[None]).shape[0]
    require_tensor(fn, "cu_num_logits", cu_num_logits, dtypes=_I32, shape=[num_rows + 1])
    num_slots = require_tensor(
        fn, "draft_tokens", draft_tokens, dtypes=_I32, shape=[None, None]
    ).shape[0]
    require_tensor(fn, "num_drafts", num_drafts, dtypes=_I32, shape=[num_rows])
    device = same_device(
        fn,
        {
            "target": target,
            "cu_num_logits": cu_num_logits,
            "slots": slots,
            "draft_tokens": draft_tokens,
            "num_drafts": num_drafts,
        },
    )
    check_index_range(fn, "slots", slots, num_slots)
    check_index_range(fn, "num_drafts", num_drafts, draft_tokens.shape[1] + 1)
    if not use_triton(fn, backend, device):
        return verify_drafts_twin(target, cu_num_logits, slots, draft_tokens, num_drafts)
    num_sampled = torch.empty(num_rows, dtype=torch.int32, device=device)  # [num_rows] int32
    triton_impl("_post_update_triton").launch_verify_drafts(
        target, cu_num_logits, slots, draft_tokens, num_drafts, num_sampled
    )
    return num_sampled


def verify_drafts_twin(
    target: torch.Tensor,
    cu_num_logits: torch.Tensor,
    slots: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
) -> torch.Tensor:
    """Torch twin of :func:`verify_drafts` (same arguments, already checked; same result)."""
    has_logits = (cu_num_logits[1:] > cu_num_logits[:-1]).to(torch.int32)  # [num_rows] int32
    max_drafts = draft_tokens.shape[1]
    if max_drafts == 0 or target.numel() == 0:
        return has_logits
    j = torch.arange(max_drafts, dtype=torch.int32, device=target.device)  # [max_drafts]
    in_draft = j < num_drafts.unsqueeze(1)  # [num_rows, max_drafts] bool
    target_pos = torch.where(
        in_draft, cu_num_logits[:-1].unsqueeze(1) + j, 0
    )  # [num_rows, max_drafts]
    targets = target.index_select(0, target_pos.flatten()).view(in_draft.shape)  # [rows, drafts]
    drafts = draft_tokens.index_select(0, slots)  # [num_rows, max_drafts] int32
    matched = ((drafts == targets) & in_draft).to(torch.int32)  # [num_rows, max_drafts]
    accepted = matched.cumprod(dim=1).sum(dim=1, dtype=torch.int32)  # [num_rows] longest prefix
    return has_logits * (1 + accepted)
