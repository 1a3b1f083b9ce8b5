"""P5: routing checker wall time (registry, 1,000 generated entry points) and accuracy vs grep.

The generated entry points use the idioms of issue 13 (a C3 diamond over an annotated base with the
model from ``build(...).to(device)``, an isinstance freshness guard, a constant-key dispatch table,
``**kwargs``, state staged on ``self``, ``importlib.import_module``) next to scopes and partials.

Run: ``python benchmarks/checker_scale.py [--quick]``. Every timing is *cold* (best of a few runs): the process-wide
parse cache is cleared first, as for a fresh ``tokenstate check``. The baseline column is the
file-level grep over the same entry points (for times) or its misclassification count (for
accuracy). Targets: whole registry <= 1 s; 1,000 entry points <= 10 s, growing linearly.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ZOO_ROOT = HERE.parent / "tests" / "checker" / "zoo"
sys.path.insert(0, str(HERE))

from _measure import print_table, row  # noqa: E402

from tokenstate.checker import (  # noqa: E402
    CheckerConfig,
    EntryTarget,
    Verdict,
    check_entry_points,
    grep_verdict,
    misclassified,
    sources as checker_sources,
)

REFERENCE_MODULES = ("tokenstate.models.llama", "tokenstate.models.nemotron_h", "tokenstate.models.kimi_linear")

_COMMON = '''
from contextvars import ContextVar
from torch import nn
from tokenstate.contracts import DeviceTokens
from tokenstate.runtime.kernels import guarded_embedding

_SCOPE = ContextVar("gen_scope", default=None)


class Scope:
    def __init__(self, inp):
        self.inp = inp

    def __enter__(self):
        _SCOPE.set(self)
        return self

    def __exit__(self, *exc):
        return None


def embed(ids, weight):
    return guarded_embedding(ids, weight)


class Base(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.weight = nn.Parameter(None)
        self.head = nn.Linear(hidden, vocab)

    def ids(self, inp):
        return inp.embedding_ids()

    def scoped(self):
        return embed(_SCOPE.get().inp.embedding_ids(), self.weight)

    def run(self, inp):
        return self.head(embed(self.ids(inp), self.weight))


class Left(Base):
    pass


class Right(Base):
    def ids(self, inp):
        if isinstance(inp.device_tokens, DeviceTokens):
            return inp.device_tokens.ids
        return inp.host_tokens.ids


class Diamond(Left, Right):
    def staged(self, inp, **kwargs):
        self.step_ids = kwargs["ids"]
        return self.head(embed(self.step_ids, self.weight))


def device_ids(inp):
    return inp.embedding_ids()


def host_ids(inp):
    return inp.host_tokens.ids


SOURCES = {"dense": device_ids, "legacy": host_ids}
'''

_ENTRY = '''

class Model{n}(common.Diamond):
    def ids(self, inp):
        tokens = super().ids(inp)
        return tokens.long() + {n} * 0


def build_{n}(config, *, device, seed):
    return Model{n}(8, 4).to(device)


@entry_point
def forward_{n}(model: common.Base, inp: ForwardInput):
    if {n} % 5 == 0:
        with common.Scope(inp):
            return model.scoped()
    if {n} % 5 == 1:
        return model.run(inp)
    if {n} % 5 == 2:
        return model.staged(inp, ids=common.SOURCES["dense"](inp))
    if {n} % 5 == 3:
        helpers = importlib.import_module("genmodels.common")
        return helpers.embed(model.ids(inp), model.weight)
    read = functools.partial(model.ids, inp)
    return common.embed(read(), model.weight)
'''


def generate(root: Path, count: int, per_module: int = 20) -> list[EntryTarget]:
    """Write a package ``genmodels`` with ``count`` distinct entry points; return their targets."""
    package = root / "genmodels"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text(_COMMON)
    targets = []
    for start in range(0, count, per_module):
        name = f"m{start // per_module:04d}"
        body = (
            "import functools\nimport importlib\n\nfrom genmodels import common\n"
            "from tokenstate.contracts import ForwardInput, entry_point\n"
        )
        for n in range(start, min(start + per_module, count)):
            body += _ENTRY.format(n=n)
            module = f"genmodels.{name}"
            targets.append(EntryTarget(f"forward_{n}", module, f"forward_{n}", True, module, f"build_{n}"))
        (package / f"{name}.py").write_text(body)
    return targets


def registry_targets() -> tuple[list[EntryTarget], list[str]]:
    """Targets (and source files) of every reference model and the three toy forwards."""
    from tokenstate.models.toy import toy_factory
    from tokenstate.runtime.registry import ModelFactory
    from tokenstate.tools.routing_check import target_of

    factories = [toy_factory(f"Toy{kind}", embed=kind) for kind in ("device", "host", "raw")]
    for name in REFERENCE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        factories += [v for v in vars(module).values() if isinstance(v, ModelFactory)]
    targets = [target_of(f) for f in factories]
    files = [str(importlib.util.find_spec(t.module).origin) for t in targets]  # type: ignore[union-attr]
    return targets, files


def cold(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall seconds of ``fn`` over ``repeats`` calls, each with the parse cache cleared.

    The best (not the median) because this box is shared: other processes only ever add time.
    """
    samples = []
    for _ in range(repeats):
        checker_sources._PARSED.clear()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples)


def zoo_accuracy() -> tuple[tuple[int, int], tuple[int, int]]:
    """(checker FP, FN) and (grep FP, FN) over the zoo."""
    spec = importlib.util.spec_from_file_location("checker_zoo_expected", ZOO_ROOT / "expected.py")
    assert spec is not None and spec.loader is not None
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    targets, expected, grep = [], {}, {}
    for (module, forward), (verdict, _) in data.EXPECTED.items():
        build = data.BUILD_FUNCTIONS.get((module, forward), (None, None))
        targets.append(EntryTarget(f"{module}.{forward}", module, forward, None, *build))
        expected[targets[-1].name] = Verdict(verdict)
        grep[targets[-1].name] = grep_verdict(ZOO_ROOT / (module.replace(".", "/") + ".py"))
    report = check_entry_points(targets, CheckerConfig(search_paths=(ZOO_ROOT,), display_root=ZOO_ROOT))
    ours = misclassified({r.entry: r.verdict for r in report.results}, expected)
    base = misclassified(grep, expected)
    return (len(ours[0]), len(ours[1])), (len(base[0]), len(base[1]))


def run(quick: bool) -> list[dict[str, Any]]:
    repeats = 3 if quick else 7
    rows = []
    targets, files = registry_targets()
    ours = cold(lambda: check_entry_points(targets), repeats)
    grep = cold(lambda: [grep_verdict(f) for f in files], repeats)
    rows.append(row(f"check whole registry ({len(targets)} forwards), cold", ours, grep,
                    unit="s (baseline: file grep)", target="<= 1 s", ok=ours <= 1.0))
    with tempfile.TemporaryDirectory() as tmp:
        times = {}
        for count in (250, 500, 1000):
            root = Path(tmp) / f"n{count}"
            generated = generate(root, count)
            config = CheckerConfig(search_paths=(root,), display_root=root)
            times[count] = cold(lambda g=generated, c=config: check_entry_points(g, c), 2 if quick else 3)
            if count == 1000:
                judged = sum(r.verdict is Verdict.HONORS for r in check_entry_points(generated, config).results)
                files = [str(root / "genmodels" / (t.module.rpartition(".")[2] + ".py")) for t in generated]
                grep = cold(lambda f=files: [grep_verdict(p) for p in f], repeats)
    rows.append(row("check 1,000 generated entry points, cold", times[1000], grep,
                    unit="s (baseline: file grep)", target="<= 10 s", ok=times[1000] <= 10.0))
    rows.append(row("generated entry points judged honors", judged, 1000, unit="of 1,000",
                    target="all", ok=judged == 1000))
    growth = times[1000] / times[500]
    rows.append(row("growth: time(1,000) / time(500)", growth, 2.0, unit="x (baseline: linear = 2)",
                    target="~2 (linear)", ok=growth <= 2.6, per_250=round(times[250], 3)))
    (fp, fn), (grep_fp, grep_fn) = zoo_accuracy()
    rows.append(row("zoo false positives (checker vs grep)", fp, grep_fp, unit="entries",
                    target="0", ok=fp == 0))
    rows.append(row("zoo false negatives (checker vs grep)", fn, grep_fn, unit="entries",
                    target="0", ok=fn == 0))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    print_table(run(quick=parser.parse_args().quick))
