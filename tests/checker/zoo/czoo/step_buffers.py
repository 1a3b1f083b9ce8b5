"""Module-level step buffers another zoo module imports and fills in place."""

import torch

SHARED_INPUT_IDS = torch.zeros(4096, dtype=torch.long)  # [max_tokens]
KEPT_IDS = torch.zeros(1, dtype=torch.long)  # [1]: ids another module keeps here between steps
