"""tokenstate: stale host token ids made impossible, visible and caught.

Subpackages: :mod:`tokenstate.contracts` (what must hold), :mod:`tokenstate.runtime` (what runs),
:mod:`tokenstate.models` (what is run), :mod:`tokenstate.checker` (the routing checker),
:mod:`tokenstate.ledger` (the spec ledger) and :mod:`tokenstate.tools` (the CLI and the token gate).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
