"""tokenstate.models — reference models: Llama-style dense, NemotronH, Kimi-Linear.

Importing this package registers their factories with the runtime registry (the runtime finds it
through the ``tokenstate.models`` entry-point group; it never imports this package by name). Each
factory serves HF-format checkpoints of its architecture and embeds a tiny deterministic preset
(``tiny-llama``, ``tiny-llama-gqa``, ``tiny-nemotron-h``, ``tiny-kimi-linear``).
"""

from tokenstate.models.kimi_linear import KIMI_LINEAR as KIMI_LINEAR
from tokenstate.models.llama import FACTORY as LLAMA
from tokenstate.models.nemotron_h import NEMOTRON_H_FACTORY as NEMOTRON_H
from tokenstate.runtime.registry import register

for _factory in (LLAMA, NEMOTRON_H, KIMI_LINEAR):
    register(_factory)

__all__ = ["KIMI_LINEAR", "LLAMA", "NEMOTRON_H"]
