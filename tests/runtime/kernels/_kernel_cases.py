"""Random kernel inputs shared by the in-process tests and the Triton-interpreter subprocess.

Run as a script (with ``TRITON_INTERPRET=1`` set before triton is imported) it launches every
Triton kernel under the interpreter on seeded random inputs, compares each with its torch twin and
prints one JSON line ``{check: "ok" | failure text}``; ``test_triton_interpreter.py`` reads it.
"""

from __future__ import annotations

import json
import os
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenstate.contracts import PLACEHOLDER, stale_position_mask

NUM_CASES = 25  # seeded random batches per kernel under the interpreter
VOCAB = 1000


@dataclass
class CombineCase:
    host_ids: torch.Tensor  # [num_tokens] int32, PLACEHOLDER at stale positions
    query_start_loc: torch.Tensor  # [num_rows + 1] int32
    seq_lens: torch.Tensor  # [num_rows] int32
    slots: torch.Tensor  # [num_rows] int32
    num_drafts: torch.Tensor  # [num_rows] int32
    prefill_len: torch.Tensor  # [num_slots] int32
    last_sampled: torch.Tensor  # [num_slots] int32
    draft_tokens: torch.Tensor  # [num_slots, max_drafts] int32
    cu_num_logits: torch.Tensor  # [num_rows + 1] int32

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.host_ids, self.query_start_loc, self.seq_lens, self.slots, self.num_drafts,
            self.prefill_len, self.last_sampled, self.draft_tokens, self.cu_num_logits,
        )  # fmt: skip

    @property
    def num_logits(self) -> int:
        return int(self.cu_num_logits[-1])

    def stale(self) -> torch.Tensor:
        """``[num_tokens]`` bool from the one Python predicate."""
        prefill_rows = self.prefill_len[self.slots.long()]
        return stale_position_mask(
            self.query_start_loc, self.seq_lens, prefill_rows, self.num_drafts
        )


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def random_combine_case(
    rng: random.Random, *, max_rows: int = 8, max_drafts: int | None = None
) -> CombineCase:
    """Rows in random slot order with empty rows, prefill chunks, decode rows and drafts."""
    max_drafts = rng.randint(0, 3) if max_drafts is None else max_drafts
    num_slots = rng.randint(1, 12)
    num_rows = rng.randint(0, min(max_rows, num_slots))
    slots = rng.sample(range(num_slots), num_rows)
    query_lens, drafts, seq_lens, logits = [], [], [], []
    prefill = [rng.randint(0, 20) for _ in range(num_slots)]
    for slot in slots:
        qlen = rng.choice([0, 1, 1, 2, 3, 5, 9])
        nd = rng.randint(0, min(max_drafts, max(qlen - 1, 0)))
        # seq_len around the slot's prefill_len so both sides of the predicate (and the boundary,
        # the chunk that completes a prefill) all occur.
        seq = max(qlen, prefill[slot] + rng.choice([-2, -1, 0, 0, 1, 1, 4]))
        query_lens.append(qlen)
        drafts.append(nd)
        seq_lens.append(seq)
        logits.append(rng.choice([0, min(1 + nd, qlen), rng.randint(0, qlen)]))
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    cu = [0]
    for n in logits:
        cu.append(cu[-1] + n)
    case = CombineCase(
        host_ids=_i32([rng.randrange(VOCAB) for _ in range(qsl[-1])]),
        query_start_loc=_i32(qsl),
        seq_lens=_i32(seq_lens),
        slots=_i32(slots),
        num_drafts=_i32(drafts),
        prefill_len=_i32(prefill),
        last_sampled=_i32([rng.randrange(VOCAB) for _ in range(num_slots)]),
        draft_tokens=_i32([rng.randrange(VOCAB) for _ in range(num_slots * max_drafts)]).view(
            num_slots, max_drafts
        ),
        cu_num_logits=_i32(cu),
    )
    case.host_ids[case.stale()] = PLACEHOLDER
    return case


def random_embedding_case(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` ``[num_tokens]`` with some PLACEHOLDER / out-of-vocab ids, ``weight`` ``[vocab, hidden]``."""
    vocab, hidden = rng.randint(1, 40), rng.choice([1, 7, 32, 70])
    num_tokens = rng.randint(0, 12)
    ids = [
        rng.choice([rng.randrange(vocab), rng.randrange(vocab), PLACEHOLDER, vocab, -7])
        for _ in range(num_tokens)
    ]
    dtype = rng.choice([torch.int32, torch.int64])
    weight = torch.randn(
        vocab, hidden, generator=torch.Generator().manual_seed(rng.randrange(2**31))
    )
    return torch.tensor(ids, dtype=dtype), weight


@dataclass
class PostUpdateCase:
    sampled: torch.Tensor  # [num_logits] int32/int64
    cu_num_logits: torch.Tensor  # [num_rows + 1] int32
    num_sampled: torch.Tensor  # [num_rows] int32
    keep: torch.Tensor  # [num_rows] bool
    query_start_loc: torch.Tensor  # [num_rows + 1] int32
    num_drafts: torch.Tensor  # [num_rows] int32
    slots: torch.Tensor  # [num_rows] int32
    last_sampled: torch.Tensor  # [num_slots] int32
    num_computed: torch.Tensor  # [num_slots] int32
    draft_tokens: torch.Tensor  # [num_slots, max_drafts] int32

    def args(self) -> tuple[torch.Tensor, ...]:
        """Arguments of post_update, with fresh copies of the in/out state."""
        return (
            self.sampled, self.cu_num_logits, self.num_sampled, self.keep, self.query_start_loc,
            self.num_drafts, self.slots, self.last_sampled.clone(), self.num_computed.clone(),
        )  # fmt: skip


def random_post_update_case(rng: random.Random) -> PostUpdateCase:
    """Decode rows, speculative rows (1 + d logits) and discarded prefill chunks, shuffled slots."""
    max_drafts = rng.randint(0, 3)
    num_slots = rng.randint(1, 10)
    slots = rng.sample(range(num_slots), rng.randint(0, num_slots))
    qlens, drafts, logits, num_sampled, keep = [], [], [], [], []
    for _ in slots:
        kind = rng.choice(["decode", "spec", "chunk", "chunk_with_logit"])
        nd = rng.randint(0, max_drafts) if kind == "spec" else 0
        qlen = 1 + nd if kind in ("decode", "spec") else rng.randint(1, 6)
        n_logits = {"decode": 1, "spec": 1 + nd, "chunk": 0, "chunk_with_logit": 1}[kind]
        kept = kind in ("decode", "spec")
        qlens.append(qlen)
        drafts.append(nd)
        logits.append(n_logits)
        keep.append(kept)
        num_sampled.append(rng.randint(1, n_logits) if kept else rng.randint(0, 1))
    qsl, cu = [0], [0]
    for q, n in zip(qlens, logits, strict=True):
        qsl.append(qsl[-1] + q)
        cu.append(cu[-1] + n)
    sampled_dtype = rng.choice([torch.int32, torch.int64])
    return PostUpdateCase(
        sampled=torch.tensor([rng.randrange(VOCAB) for _ in range(cu[-1])], dtype=sampled_dtype),
        cu_num_logits=_i32(cu),
        num_sampled=_i32(num_sampled),
        keep=torch.tensor(keep, dtype=torch.bool),
        query_start_loc=_i32(qsl),
        num_drafts=_i32(drafts),
        slots=_i32(slots),
        last_sampled=_i32([rng.randrange(VOCAB) for _ in range(num_slots)]),
        num_computed=_i32([rng.randint(0, 50) for _ in range(num_slots)]),
        # A tiny draft alphabet so that drafts often match the targets and prefixes vary.
        draft_tokens=_i32([rng.randrange(3) for _ in range(num_slots * max_drafts)]).view(
            num_slots, max_drafts
        ),
    )


# --- the interpreter checks (run in a subprocess with TRITON_INTERPRET=1) ---------------------


def _check_combine(backend: str) -> None:
    from tokenstate.runtime.kernels import combine

    rng = random.Random(1234)
    for i in range(NUM_CASES):
        case = random_combine_case(rng)
        got_ids, got_logits = combine(*case.args(), backend=backend)
        want_ids, want_logits = combine(*case.args(), backend="torch")
        assert torch.equal(got_ids, want_ids), f"case {i}: input_ids {got_ids} != twin {want_ids}"
        assert torch.equal(got_logits, want_logits), (
            f"case {i}: logits {got_logits} != {want_logits}"
        )


def _check_predicate_pinned(backend: str) -> None:
    """The kernel's copy of the predicate replaces exactly the positions stale_position_mask marks."""
    from tokenstate.runtime.kernels import combine

    rng = random.Random(99)
    for i in range(NUM_CASES * 2):
        case = random_combine_case(rng)
        case.host_ids.fill_(PLACEHOLDER)  # every position starts as a placeholder
        case.last_sampled.clamp_(min=0)
        ids, _ = combine(*case.args(), backend=backend)
        replaced = ids != PLACEHOLDER  # [num_tokens] bool
        assert torch.equal(replaced, case.stale()), (
            f"case {i}: kernel {replaced} != predicate {case.stale()}"
        )


def _check_embedding(backend: str) -> None:
    from tokenstate.runtime.kernels import (
        EmbeddedBadIdsError,
        StepGuard,
        guarded_embedding,
        guarded_embedding_twin,
    )

    rng = random.Random(7)
    for i in range(NUM_CASES):
        ids, weight = random_embedding_case(rng)
        if rng.random() < 0.3:
            weight = weight.half()
        guard = StepGuard()
        with guard:
            out = guarded_embedding(ids, weight, backend=backend)
        want, want_bad = guarded_embedding_twin(ids, weight)
        assert torch.equal(out, want), f"case {i}: rows differ from the twin"
        want_positions = tuple(want_bad.nonzero().flatten().tolist())
        try:
            guard.raise_if_violated()
            got_positions: tuple[int, ...] = ()
        except EmbeddedBadIdsError as exc:
            got_positions = exc.positions
        assert got_positions == want_positions, (
            f"case {i}: flagged {got_positions} != twin {want_positions}"
        )


def _check_post_update(backend: str) -> None:
    from tokenstate.runtime.kernels import post_update

    rng = random.Random(5)
    for i in range(NUM_CASES):
        case = random_post_update_case(rng)
        got = case.args()
        want = case.args()
        post_update(*got, backend=backend)
        post_update(*want, backend="torch")
        assert torch.equal(got[7], want[7]), f"case {i}: last_sampled {got[7]} != twin {want[7]}"
        assert torch.equal(got[8], want[8]), f"case {i}: num_computed {got[8]} != twin {want[8]}"


def _check_verify_drafts(backend: str) -> None:
    from tokenstate.runtime.kernels import verify_drafts

    rng = random.Random(11)
    for i in range(NUM_CASES):
        case = random_post_update_case(rng)
        target = case.sampled.remainder(3)  # same tiny alphabet as the drafts
        args = (target, case.cu_num_logits, case.slots, case.draft_tokens, case.num_drafts)
        got = verify_drafts(*args, backend=backend)
        want = verify_drafts(*args, backend="torch")
        assert torch.equal(got, want), f"case {i}: num_sampled {got} != twin {want}"


CHECKS: dict[str, Callable[[str], None]] = {
    "combine": _check_combine,
    "predicate_pinned": _check_predicate_pinned,
    "embedding": _check_embedding,
    "post_update": _check_post_update,
    "verify_drafts": _check_verify_drafts,
}


def run_checks(backend: str = "triton") -> dict[str, str]:
    results = {}
    for name, check in CHECKS.items():
        try:
            check(backend)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=4)
    return results


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (set before triton is imported)")
    print(json.dumps(run_checks()))
