"""tokenstate.runtime.kernels — Triton kernels behind typed launchers, each with CPU twins.

* :func:`combine` splices the device-side sampled and draft tokens into the step's input ids (per
  the row predicate) and produces the logits indices.
* :func:`guarded_embedding` / :class:`GuardedEmbedding` gather embedding rows and refuse ids outside
  ``[0, vocab)``, recording them in the current :class:`StepGuard` until the runner's sync point.
* :func:`post_update` advances the slot-indexed mirror after sampling; :func:`verify_drafts` does
  speculative verification against the sampled tokens.

Each public launcher checks its arguments' metadata (``combine`` and ``post_update`` take
``validate=False`` for a caller whose buffers are right by construction: the model runner, outside
``full`` checks mode), then runs the Triton kernel on CUDA tensors. On
CPU tensors, ``combine`` and ``post_update`` run numpy host twins (``backend="auto"``: a step's few
dozen ints cost less in numpy than in torch dispatch), the embedding gather and ``verify_drafts``
run their torch twins (``*_twin``); every twin has the kernel's exact semantics and the kernel
tests compare them all. Importing this package never imports triton.
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
