"""A module outside the analysed packages (the zoo's root is ``czoo``): its buffer is an object the
checker does not read, which a zoo forward fills in place."""

import torch

OUTSIDE_INPUT_IDS = torch.zeros(4096, dtype=torch.long)  # [max_tokens]
