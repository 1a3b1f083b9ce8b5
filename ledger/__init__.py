"""tokenstate.ledger — spec documents, mutants and the ledger of owed and paid items.

The pytest side lives in :mod:`tokenstate.ledger.plugin` (loaded by the ``tokenstate``
pytest plugin); importing this package does not import pytest.
"""

from tokenstate.ledger.ledger import (
    LEDGER_VERSION as LEDGER_VERSION,
    RESULTS as RESULTS,
    Ledger as Ledger,
    LedgerEntry as LedgerEntry,
)
from tokenstate.ledger.mutants import (
    Mutant as Mutant,
    MutantPatch as MutantPatch,
    mutant as mutant,
)
from tokenstate.ledger.spec import (
    Spec as Spec,
    SpecItem as SpecItem,
    load_specs as load_specs,
    parse_spec as parse_spec,
)

__all__ = [
    "LEDGER_VERSION",
    "RESULTS",
    "Ledger",
    "LedgerEntry",
    "Mutant",
    "MutantPatch",
    "Spec",
    "SpecItem",
    "load_specs",
    "mutant",
    "parse_spec",
]
