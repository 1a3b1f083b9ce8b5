"""The numpy twins (the CPU's ``backend="auto"``) equal the torch twins on random batches."""

from __future__ import annotations

import random
from types import ModuleType

import torch

from tokenstate.runtime.kernels import combine, post_update


def test_numpy_combine_equals_the_torch_twin(cases: ModuleType) -> None:
    rng = random.Random(11)
    for i in range(150):
        case = cases.random_combine_case(rng)
        host_ids, host_logits = combine(*case.args())  # backend="auto" on the CPU: numpy
        twin_ids, twin_logits = combine(*case.args(), backend="torch")
        assert torch.equal(host_ids, twin_ids), f"case {i}"
        assert torch.equal(host_logits, twin_logits), f"case {i}"
        assert host_logits.dtype == twin_logits.dtype == torch.int64


def test_numpy_post_update_equals_the_torch_twin(cases: ModuleType) -> None:
    rng = random.Random(12)
    for i in range(150):
        case = cases.random_post_update_case(rng)
        host_args, twin_args = case.args(), case.args()
        post_update(*host_args)  # backend="auto" on the CPU: numpy
        post_update(*twin_args, backend="torch")
        assert torch.equal(host_args[-2], twin_args[-2]), f"case {i}: last_sampled"
        assert torch.equal(host_args[-1], twin_args[-1]), f"case {i}: num_computed"


def test_numpy_combine_leaves_the_host_buffer_untouched(cases: ModuleType) -> None:
    case = cases.random_combine_case(random.Random(13))
    before = case.host_ids.clone()
    combine(*case.args())
    assert torch.equal(case.host_ids, before)
