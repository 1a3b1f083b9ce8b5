"""Uploading to CUDA on a machine without it is a typed error that names the way out."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import ConfigError, DeviceTokens, HostTokens


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_from_host_to_cuda_without_cuda_is_a_config_error():
    host = HostTokens(
        torch.tensor([1, 2], dtype=torch.int32),  # [num_tokens]
        torch.zeros(2, dtype=torch.bool),  # [num_tokens]
        torch.tensor([0, 2], dtype=torch.int32),  # [num_rows + 1]
        torch.tensor([0], dtype=torch.int32),  # [num_rows]
    )
    with pytest.raises(ConfigError, match=r"^DeviceTokens\.from_host: device='cuda' but CUDA is not available "
                       r"in this process; upload to device='cpu' \(the CPU runs the same data flow\)\.$"):
        DeviceTokens.from_host(host, "cuda", vocab_size=8)
    with pytest.raises(ConfigError, match=r"device='cuda:1'"):
        DeviceTokens.from_host(host, torch.device("cuda:1"), vocab_size=8)
    assert DeviceTokens.from_host(host, "cpu", vocab_size=8).ids.tolist() == [1, 2]
