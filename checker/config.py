"""What the routing checker treats as an embedding (the sink set) and which modules it reads.

The sink set is deliberately explicit and configurable: an embedding lookup is any call that turns
token ids into rows of a table. By default that is

* ``tokenstate.runtime.kernels.guarded_embedding(ids, weight)`` and ``torch.nn.functional.embedding``
  / ``torch.embedding`` (functions; the ids argument by position or keyword);
* calling an instance of ``tokenstate.runtime.kernels.GuardedEmbedding`` or ``torch.nn.Embedding``
  (or of an analysed subclass that does not override ``forward``);
* ``index_select`` on a table with token ids as the index, and ``table[ids]`` indexing — every
  gather keyed by token ids reads one row per token, which is exactly an embedding lookup.

Modules are *analysed* (their source is read and followed) when their top-level package is one of
``roots`` (the checker adds the package of every entry point it is given); modules under
``modeled`` are never read — their semantics are built in (the type states) or they are sinks.
Everything else is *external* and treated as a tensor operation: its result carries the token ids
of its arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tokenstate.contracts.errors import ConfigError

__all__ = ["DEFAULT_SINKS", "CheckerConfig", "SinkSpec"]


@dataclass(frozen=True)
class SinkSpec:
    """One embedding entry: ``dotted`` name, and where its ids argument sits.

    Attributes:
        dotted: the importable name (``torch.nn.functional.embedding``).
        kind: ``function`` (calling it embeds) or ``module`` (calling an instance of it embeds).
        ids_index: position of the ids argument (for ``module``: in the instance call).
        ids_keywords: keyword names the ids argument may be passed as.
    """

    dotted: str
    kind: str = "function"
    ids_index: int = 0
    ids_keywords: tuple[str, ...] = ("ids", "input")

    def __post_init__(self) -> None:
        if self.kind not in ("function", "module"):
            raise ConfigError(f"SinkSpec {self.dotted}: kind must be 'function' or 'module', got {self.kind!r}.")
        if "." not in self.dotted:
            raise ConfigError(f"SinkSpec {self.dotted!r}: give the full dotted name (package.module.name).")


DEFAULT_SINKS: tuple[SinkSpec, ...] = (
    SinkSpec("tokenstate.runtime.kernels.guarded_embedding", "function", 0, ("ids",)),
    SinkSpec("tokenstate.runtime.kernels.GuardedEmbedding", "module", 0, ("ids",)),
    SinkSpec("torch.nn.functional.embedding", "function", 0, ("input",)),
    SinkSpec("torch.embedding", "function", 1, ("indices",)),
    SinkSpec("torch.nn.Embedding", "module", 0, ("input",)),
    SinkSpec("torch.index_select", "function", 2, ("index",)),
)

# Methods of a table tensor that gather rows by an index argument (position of that argument).
DEFAULT_GATHER_METHODS: tuple[tuple[str, int], ...] = (("index_select", 1),)

DEFAULT_MODELED: tuple[str, ...] = ("tokenstate.contracts", "tokenstate.runtime.kernels")

# Decorators whose result runs the function's body out of the checker's sight (compiled, scripted,
# traced, graph-captured): a call through one is `unknown`. Other decorators are assumed to return
# the function they wrap.
DEFAULT_OPAQUE_WRAPPERS: frozenset[str] = frozenset({
    "torch.compile",
    "torch.compiler.compile",
    "torch.jit.script",
    "torch.jit.trace",
    "torch.jit.trace_module",
    "torch.utils.checkpoint.checkpoint",
    "torch.cuda.make_graphed_callables",
    "torch.vmap",
    "torch.func.vmap",
    "torch.func.functional_call",
    # the implementation that runs is picked by the argument's type at run time, among
    # functions registered anywhere (@f.register): the checker does not pick it
    "functools.singledispatch",
    "functools.singledispatchmethod",
})


@dataclass(frozen=True)
class CheckerConfig:
    """Settings of one checker run.

    Attributes:
        sinks: the embedding entries (see the module docs).
        gather_methods: tensor methods that gather rows by an index, with that index's position.
        index_is_sink: whether ``table[ids]`` with token ids as the index counts as an embedding.
        roots: extra top-level packages whose source is analysed.
        modeled: module prefixes never read (built-in semantics or sinks).
        search_paths: extra directories to locate analysed modules in (like ``sys.path`` entries,
            searched first); nothing is imported from them.
        display_root: file names in reports are shown relative to this directory when inside it.
        opaque_wrappers: decorators whose wrapped function is not followed (its calls are
            ``unknown``); any analysed function or module *passed* to external code is too.
    """

    sinks: tuple[SinkSpec, ...] = DEFAULT_SINKS
    gather_methods: tuple[tuple[str, int], ...] = DEFAULT_GATHER_METHODS
    index_is_sink: bool = True
    roots: frozenset[str] = frozenset({"tokenstate"})
    modeled: tuple[str, ...] = DEFAULT_MODELED
    search_paths: tuple[Path, ...] = ()
    display_root: Path = field(default_factory=Path.cwd)
    opaque_wrappers: frozenset[str] = DEFAULT_OPAQUE_WRAPPERS

    def with_roots(self, extra: Iterable[str]) -> CheckerConfig:
        """A copy that also analyses the given top-level packages."""
        return dataclasses.replace(self, roots=self.roots | frozenset(extra))

    def is_modeled(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modeled)

    def is_analysed(self, module: str) -> bool:
        return module.partition(".")[0] in self.roots and not self.is_modeled(module)

    def display(self, path: str) -> str:
        return _display(path, self.display_root)


@functools.lru_cache(maxsize=4096)
def _display(path: str, root: Path) -> str:
    resolved = Path(path).resolve()  # an editable install's link: the source file it stands for
    try:
        return str(resolved.relative_to(root.resolve()))
    except ValueError:
        return str(resolved) if Path(path).is_absolute() else path
