"""Suite-wide settings for the 2-core machines tests run on."""

from __future__ import annotations

import torch

# Tiny models spend their time in op dispatch, not in maths: with pytest-xdist running one worker
# per core, intra-op threads only contend with the other worker (seen: a 6 ms decode step at 665 ms).
torch.set_num_threads(1)
