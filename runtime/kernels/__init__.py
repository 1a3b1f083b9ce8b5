"""tokenstate.runtime.kernels — Triton kernels behind typed launchers, each with a torch twin.

* :func:`combine` splices the device-side sampled and draft tokens into the step's input ids (per
  the row predicate) and produces the logits indices.
* :func:`guarded_embedding` / :class:`GuardedEmbedding` gather embedding rows and refuse ids outside
  ``[0, vocab)``, recording them in the current :class:`StepGuard` until the runner's sync point.
* :func:`post_update` advances the slot-indexed mirror after sampling; :func:`verify_drafts` does
  greedy speculative verification.

Each public launcher checks its arguments' metadata, then runs the Triton kernel on CUDA tensors and
the ``*_twin`` on CPU tensors. Importing this package never imports triton.
"""

from tokenstate.runtime.kernels._launch import BACKENDS as BACKENDS
from tokenstate.runtime.kernels.combine import combine as combine, combine_twin as combine_twin
from tokenstate.runtime.kernels.embedding import (
    GuardedEmbedding as GuardedEmbedding,
    guarded_embedding as guarded_embedding,
    guarded_embedding_twin as guarded_embedding_twin,
)
from tokenstate.runtime.kernels.guard import (
    EmbeddedBadIdsError as EmbeddedBadIdsError,
    StepGuard as StepGuard,
    current_guard as current_guard,
)
from tokenstate.runtime.kernels.post_update import (
    post_update as post_update,
    post_update_twin as post_update_twin,
    verify_drafts as verify_drafts,
    verify_drafts_twin as verify_drafts_twin,
)

__all__ = [
    "BACKENDS",
    "EmbeddedBadIdsError",
    "GuardedEmbedding",
    "StepGuard",
    "combine",
    "combine_twin",
    "current_guard",
    "guarded_embedding",
    "guarded_embedding_twin",
    "post_update",
    "post_update_twin",
    "verify_drafts",
    "verify_drafts_twin",
]
