"""A zoo of small registered forwards for the routing checker's tests.

The checker only reads them; the runtime cross-check (specs/tests/test_routing_checker.py, RCK-15)
imports them to run each through the async engine.

Each module shows one routing pattern in an honouring and an ignoring variant; the expected verdicts
live in tests/checker/zoo/expected.py.
"""

from czoo import model_patches  # noqa: F401  (patches czoo.patched_models when imported)
from czoo.helpers import embed_ids as reexported_embed, host_ids_of as reexported_host_ids

__all__ = ["reexported_embed", "reexported_host_ids"]
