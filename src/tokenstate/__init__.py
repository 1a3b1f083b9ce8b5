"""tokenstate: stale host token ids made impossible, visible and caught.

Subpackages: :mod:`tokenstate.contracts` (what must hold), :mod:`tokenstate.runtime` (what runs),
:mod:`tokenstate.models` (what is run).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
