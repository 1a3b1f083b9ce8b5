"""On CUDA the public launchers run Triton; its results equal the torch twins'."""

from __future__ import annotations

import random
from types import ModuleType

import pytest
import torch

from tokenstate.runtime.kernels import (
    EmbeddedBadIdsError,
    StepGuard,
    combine,
    guarded_embedding,
    guarded_embedding_twin,
    post_update,
    verify_drafts,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_triton_on_cuda_matches_the_twins(cases: ModuleType) -> None:
    rng = random.Random(4242)
    for i in range(50):
        case = cases.random_combine_case(rng, max_rows=64)
        cuda_args = [t.cuda() for t in case.args()]
        ids, logits = combine(*cuda_args, num_logits=case.num_logits)
        want_ids, want_logits = combine(*case.args(), backend="torch")
        assert torch.equal(ids.cpu(), want_ids) and torch.equal(logits.cpu(), want_logits), (
            f"combine {i}"
        )

        ids_e, weight = cases.random_embedding_case(rng)
        with StepGuard() as guard:
            out = guarded_embedding(ids_e.cuda(), weight.cuda())
        want, want_bad = guarded_embedding_twin(ids_e, weight)
        assert torch.equal(out.cpu(), want), f"embedding {i}"
        if bool(want_bad.any()):
            with pytest.raises(EmbeddedBadIdsError, match="outside"):
                guard.raise_if_violated()
        else:
            guard.raise_if_violated()

        step = cases.random_post_update_case(rng)
        got, expected = [t.cuda() for t in step.args()], step.args()
        post_update(*got)
        post_update(*expected, backend="torch")
        assert torch.equal(got[7].cpu(), expected[7]) and torch.equal(got[8].cpu(), expected[8]), (
            f"post_update {i}"
        )
        target = step.sampled.remainder(3)
        verify_args = (target, step.cu_num_logits, step.slots, step.draft_tokens, step.num_drafts)
        got_ns = verify_drafts(*[t.cuda() for t in verify_args])
        assert torch.equal(got_ns.cpu(), verify_drafts(*verify_args, backend="torch")), (
            f"verify {i}"
        )
