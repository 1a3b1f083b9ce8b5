"""Focused rules of the checker outside the zoo: edge cases of guards, MRO, dicts and external calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenstate.checker import CheckerConfig, EntryTarget, Verdict, check_entry_points

HEADER = "import typing\nimport torch\nfrom torch import nn\nfrom tokenstate.runtime.kernels import guarded_embedding\n\n"


def verdict_of(tmp_path: Path, body: str) -> Verdict:
    root = tmp_path / "pkgs"
    (root / "rulepkg").mkdir(parents=True)
    (root / "rulepkg" / "__init__.py").write_text("")
    (root / "rulepkg" / "model.py").write_text(HEADER + body)
    config = CheckerConfig(search_paths=(root,), display_root=root)
    (result,) = check_entry_points([EntryTarget("rule", "rulepkg.model", "forward", True)], config).results
    assert result.error is None, result.error
    return result.verdict


CASES = {
    "a flag joined with plain data guards nothing": (
        "def fresh(inp):\n    return False if inp.num_rows else inp.device_tokens is None\n\n"
        "def forward(model, inp):\n    if fresh(inp):\n        return guarded_embedding(inp.host_tokens.ids, None)\n"
        "    return guarded_embedding(inp.embedding_ids(), None)\n",
        Verdict.IGNORES,
    ),
    "bool() of a flag still guards": (
        "def forward(model, inp):\n    ok = bool(inp.device_tokens is None)\n"
        "    ids = inp.host_tokens.ids if ok else inp.device_tokens.ids\n    return guarded_embedding(ids, None)\n",
        Verdict.HONORS,
    ),
    "an early return on isinstance leaves only fresh host ids": (
        "from tokenstate.contracts import DeviceTokens\n\n"
        "def forward(model, inp):\n    if isinstance(inp.device_tokens, DeviceTokens):\n"
        "        return guarded_embedding(inp.device_tokens.ids, None)\n"
        "    return guarded_embedding(inp.host_tokens.ids, None)\n",
        Verdict.HONORS,
    ),
    "typing.cast keeps the value": (
        "class M(nn.Module):\n    def ids(self, inp):\n        return inp.host_tokens.ids\n\n"
        "def forward(model: M, inp):\n    m = typing.cast(M, model)\n    return guarded_embedding(m.ids(inp), None)\n",
        Verdict.IGNORES,
    ),
    "a lookup with a key that is not constant joins every value": (
        "def dev(inp):\n    return inp.embedding_ids()\n\ndef host(inp):\n    return inp.host_tokens.ids\n\n"
        "TABLE = {'a': dev, 'b': host}\n\n"
        "def forward(model, inp):\n    return guarded_embedding(TABLE[str(inp.num_rows)](inp), None)\n",
        Verdict.IGNORES,
    ),
    "**kwargs with unknown keys reach every unbound parameter": (
        "def embed(input_ids=None, weight=None):\n    return guarded_embedding(input_ids, weight)\n\n"
        "def forward(model, inp):\n    extra = dict(model.options)\n    extra.update(input_ids=inp.embedding_ids())\n"
        "    return embed(**{str(k): v for k, v in [('input_ids', inp.embedding_ids())]})\n",
        Verdict.HONORS,
    ),
    "DeviceTokens.from_host(inp.host_tokens) reads host ids": (
        "from tokenstate.contracts import DeviceTokens\n\n"
        "def forward(model, inp):\n    dev = DeviceTokens.from_host(inp.host_tokens, 'cpu', vocab_size=8)\n"
        "    return guarded_embedding(inp.embedding_ids(), None)\n",
        Verdict.IGNORES,
    ),
    "an inconsistent hierarchy still resolves (depth-first fallback)": (
        "class A(nn.Module):\n    def ids(self, inp):\n        return inp.embedding_ids()\n\n"
        "class B(A):\n    pass\n\nclass C(A, B):\n    pass\n\n"
        "def forward(model: C, inp):\n    return guarded_embedding(model.ids(inp), None)\n",
        Verdict.HONORS,
    ),
    "a method an external base not loaded may define, handed the forward input, is unknown": (
        "from some_engine_lib import PreTrainedBase\n\nclass M(PreTrainedBase):\n    pass\n\n"
        "def forward(model: M, inp):\n    return guarded_embedding(model.token_ids(inp), None)\n",
        Verdict.UNKNOWN,
    ),
    "a plain mixin after nn.Module provides what nn.Module lacks (C3)": (
        "class Ids:\n    def token_ids(self, inp):\n        return inp.host_tokens.ids\n\n"
        "class M(nn.Module, Ids):\n    pass\n\n"
        "def forward(model: M, inp):\n    return guarded_embedding(model.token_ids(inp), None)\n",
        Verdict.IGNORES,
    ),
    "`host or device` always picks the host tokens (HostTokens is truthy)": (
        "def forward(model, inp):\n    return guarded_embedding((inp.host_tokens or inp.device_tokens).ids, None)\n",
        Verdict.IGNORES,
    ),
    "`device or host` falls back to host ids only without device ids": (
        "def forward(model, inp):\n    return guarded_embedding((inp.device_tokens or inp.host_tokens).ids, None)\n",
        Verdict.HONORS,
    ),
    "`device and device.ids` reads device ids": (
        "def forward(model, inp):\n    ids = inp.device_tokens and inp.device_tokens.ids\n"
        "    return guarded_embedding(ids if ids is not None else inp.embedding_ids(), None)\n",
        Verdict.HONORS,
    ),
    "a match on the device tokens guards like an if": (
        "def forward(model, inp):\n    match inp.device_tokens:\n        case None:\n"
        "            ids = inp.host_tokens.ids\n        case dev:\n            ids = dev.ids\n"
        "    return guarded_embedding(ids, None)\n",
        Verdict.HONORS,
    ),
    "a case after `case DeviceTokens():` runs without device ids": (
        "from tokenstate.contracts import DeviceTokens\n\n"
        "def forward(model, inp):\n    match inp.device_tokens:\n        case DeviceTokens() as dev:\n"
        "            ids = dev.ids\n        case _:\n            ids = inp.host_tokens.ids\n"
        "    return guarded_embedding(ids, None)\n",
        Verdict.HONORS,
    ),
    "host tokens taken without device ids stay fresh after the branch": (
        "def forward(model, inp):\n    src = inp.host_tokens if inp.device_tokens is None else inp.device_tokens\n"
        "    return guarded_embedding(src.ids, None)\n",
        Verdict.HONORS,
    ),
    "a match that reads host ids where device ids exist is a finding": (
        "def forward(model, inp):\n    match inp.device_tokens:\n        case None:\n"
        "            ids = inp.embedding_ids()\n        case _:\n            ids = inp.host_tokens.ids\n"
        "    return guarded_embedding(ids, None)\n",
        Verdict.IGNORES,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule(tmp_path: Path, case: str) -> None:
    body, expected = CASES[case]
    assert verdict_of(tmp_path, body) is expected


def test_a_host_read_embedded_on_its_own_line_shows_the_embedding_route_first(tmp_path: Path) -> None:
    """The read and the embedding of the same ids on one line are two routes, not one: the
    embedding (the one to show) must not be folded into the plain read."""
    root = tmp_path / "pkgs"
    (root / "sameline").mkdir(parents=True)
    (root / "sameline" / "__init__.py").write_text("")
    (root / "sameline" / "model.py").write_text(
        HEADER + "def forward(model, inp):\n    return guarded_embedding(inp.host_tokens.ids, None)\n"
    )
    config = CheckerConfig(search_paths=(root,), display_root=root)
    (result,) = check_entry_points([EntryTarget("same", "sameline.model", "forward", True)], config).results
    assert result.verdict is Verdict.IGNORES
    assert result.routes[0].sink.endswith("guarded_embedding(ids)"), [r.sink for r in result.routes]
    assert len(result.routes) == 2
