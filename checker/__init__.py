"""The routing checker: does every registered forward embed device token ids?

It reads source with the standard ``ast`` module — it never imports or runs the analysed code —
starting from each registered forward entry point, and follows every route interprocedurally:
direct calls, methods through the class hierarchy (``self.`` calls, attributes holding sub-modules,
``super()``), module aliases and re-exports, class aliases, ``functools.partial``, containers of
modules (``nn.ModuleList``, ``nn.Sequential``, dicts), and context managers that publish token ids
to a deep consumer (scopes: ``ContextVar``, ``threading.local``, class attributes, module globals,
module-level stacks). Each entry point gets a :class:`Verdict` and, for every embedding it reaches,
a :class:`Route` ``entry → … → sink`` with file:line.

Use :func:`check_entry_points` on :class:`EntryTarget` s; ``tokenstate check`` (in
``tokenstate.tools.routing_check``) builds the targets from the model registry.
"""

from tokenstate.checker.config import (
    DEFAULT_SINKS as DEFAULT_SINKS,
    CheckerConfig as CheckerConfig,
    SinkSpec as SinkSpec,
)
from tokenstate.checker.engine import check_entry_points as check_entry_points
from tokenstate.checker.grep_baseline import (
    grep_verdict as grep_verdict,
    misclassified as misclassified,
)
from tokenstate.checker.report import (
    CheckReport as CheckReport,
    EntryResult as EntryResult,
    EntryTarget as EntryTarget,
    Hop as Hop,
    Route as Route,
    Verdict as Verdict,
)

__all__ = [
    "DEFAULT_SINKS",
    "CheckReport",
    "CheckerConfig",
    "EntryResult",
    "EntryTarget",
    "Hop",
    "Route",
    "SinkSpec",
    "Verdict",
    "check_entry_points",
    "grep_verdict",
    "misclassified",
]
