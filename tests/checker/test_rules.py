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
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule(tmp_path: Path, case: str) -> None:
    body, expected = CASES[case]
    assert verdict_of(tmp_path, body) is expected
