"""tokenstate.contracts.ledger — spec documents, mutants and the ledger of owed and paid items.

The pytest side lives in :mod:`tokenstate.contracts.ledger.plugin` (loaded by the ``tokenstate``
pytest plugin); importing this package does not import pytest.
"""

from tokenstate.contracts.ledger.ledger import (
    LEDGER_VERSION as LEDGER_VERSION,
)
from tokenstate.contracts.ledger.ledger import (
    RESULTS as RESULTS,
)
from tokenstate.contracts.ledger.ledger import (
    Ledger as Ledger,
)
from tokenstate.contracts.ledger.ledger import (
    LedgerEntry as LedgerEntry,
)
from tokenstate.contracts.ledger.mutants import (
    Mutant as Mutant,
)
from tokenstate.contracts.ledger.mutants import (
    MutantPatch as MutantPatch,
)
from tokenstate.contracts.ledger.mutants import (
    mutant as mutant,
)
from tokenstate.contracts.ledger.spec import (
    Spec as Spec,
)
from tokenstate.contracts.ledger.spec import (
    SpecItem as SpecItem,
)
from tokenstate.contracts.ledger.spec import (
    load_specs as load_specs,
)
from tokenstate.contracts.ledger.spec import (
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
