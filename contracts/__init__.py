"""tokenstate.contracts — what must hold: type states, checked entry points, errors.

Importing this package never imports triton or transformers.
"""

from tokenstate.contracts.checks import (
    CHECK_MODES as CHECK_MODES,
    checks_mode as checks_mode,
    get_checks_mode as get_checks_mode,
    set_checks_mode as set_checks_mode,
    validated_setting as validated_setting,
)
from tokenstate.contracts.entry_point import EntryPoint as EntryPoint, entry_point as entry_point
from tokenstate.contracts.errors import (
    ConfigError as ConfigError,
    ContractDefinitionError as ContractDefinitionError,
    ContractViolation as ContractViolation,
    EmbeddedBadIdsError as EmbeddedBadIdsError,
    StaleHostTokensError as StaleHostTokensError,
    TokenStateError as TokenStateError,
)
from tokenstate.contracts.forward_input import (
    BatchLayout as BatchLayout,
    ForwardInput as ForwardInput,
    IndexPlan as IndexPlan,
    RowSpan as RowSpan,
    StepIndices as StepIndices,
)
from tokenstate.contracts.predicate import (
    spliced_rows as spliced_rows,
    stale_position_mask as stale_position_mask,
)
from tokenstate.contracts.tokens import (
    PLACEHOLDER as PLACEHOLDER,
    DeviceTokens as DeviceTokens,
    HostTokens as HostTokens,
)

__all__ = [
    "CHECK_MODES",
    "PLACEHOLDER",
    "BatchLayout",
    "ConfigError",
    "ContractDefinitionError",
    "ContractViolation",
    "DeviceTokens",
    "EmbeddedBadIdsError",
    "EntryPoint",
    "ForwardInput",
    "HostTokens",
    "IndexPlan",
    "RowSpan",
    "StaleHostTokensError",
    "StepIndices",
    "TokenStateError",
    "checks_mode",
    "entry_point",
    "get_checks_mode",
    "set_checks_mode",
    "spliced_rows",
    "stale_position_mask",
    "validated_setting",
]
