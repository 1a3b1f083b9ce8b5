"""Suite-wide settings for the 2-core machines tests run on."""

from __future__ import annotations

import pytest
import torch

from tokenstate.contracts import set_checks_mode

# Tiny models spend their time in op dispatch, not in maths: with pytest-xdist running one worker
# per core, intra-op threads only contend with the other worker (seen: a 6 ms decode step at 665 ms).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _reset_checks_mode():
    """Every test starts from the mode TOKENSTATE_CHECKS selects, whatever an earlier test set."""
    set_checks_mode(None)
    yield
    set_checks_mode(None)
