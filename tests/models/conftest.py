"""Shared helpers for model tests: real ForwardInput builders and the HF oracle.

Fixtures (usable by every model's tests):

* ``make_input(rows, vocab_size=..., ...)`` — a :class:`~tokenstate.contracts.ForwardInput` for
  rows given as tuples ``(slot, query_tokens, num_computed=0, num_drafts=0)``, built with the
  contracts' own constructors. Logits are read at each row's last ``1 + num_drafts`` positions, or
  at every position with ``all_logits=True``. ``stale_last=True`` puts PLACEHOLDER on the host at
  each row's last ``1 + num_drafts`` positions and the real ids in ``DeviceTokens``, as the async
  path does; ``device_ids=True`` sends device ids for fresh rows too.
* ``hf_oracle`` — ``.load(path)`` an HF causal LM from a local directory (never downloads),
  ``.logits(model, ids)`` its float32 logits ``[len(ids), vocab]`` from one causal forward, and
  ``.max_step_diff(...)``: drive our forward through a list of steps (rows as above, teacher
  forced) and return the largest |ours - oracle| over every logit produced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
)

# The oracle runs from tiny local directories only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass(frozen=True)
class Row:
    """One batch row: ``tokens`` at positions ``num_computed ..`` of ``slot``'s sequence."""

    slot: int
    tokens: list[int]
    num_computed: int = 0
    num_drafts: int = 0

    def logit_offsets(self, all_logits: bool) -> list[int]:
        if all_logits:
            return list(range(len(self.tokens)))
        # Like a runner: the last token and every draft position.
        return list(range(len(self.tokens) - 1 - self.num_drafts, len(self.tokens)))


@dataclass
class _Builder:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __call__(
        self,
        rows: list[tuple],
        *,
        vocab_size: int,
        all_logits: bool = False,
        stale_last: bool = False,
        device_ids: bool = False,
    ) -> ForwardInput:
        rows = [Row(*r) for r in rows]
        qsl, positions, ids, stale, logits = [0], [], [], [], []
        for r in rows:
            start = qsl[-1]
            ids += r.tokens
            positions += range(r.num_computed, r.num_computed + len(r.tokens))
            tail = 1 + r.num_drafts if stale_last else 0
            stale += [i >= len(r.tokens) - tail for i in range(len(r.tokens))]
            logits += [start + o for o in r.logit_offsets(all_logits)]
            qsl.append(start + len(r.tokens))
        i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
        real = i32(ids)  # [num_tokens]
        stale_mask = torch.tensor(stale, dtype=torch.bool)  # [num_tokens]
        slots = i32([r.slot for r in rows])  # [num_rows]
        host = HostTokens(
            torch.where(stale_mask, torch.full_like(real, PLACEHOLDER), real), stale_mask, i32(qsl), slots
        )
        device_tokens = None
        if stale_last or device_ids:
            device_tokens = DeviceTokens.from_combine(real.to(self.device), vocab_size=vocab_size)
        layout = BatchLayout(
            i32(qsl),
            i32([r.num_computed + len(r.tokens) for r in rows]),
            slots,
            i32([r.num_drafts for r in rows]),
            torch.tensor(logits, dtype=torch.int64),
        )
        return ForwardInput(
            host_tokens=host,
            device_tokens=device_tokens,
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            layout=layout,
            logits_indices=layout.logits_indices.to(self.device),
            slots=slots.long().to(self.device),
        )


class HFOracle:
    """HF transformers causal LMs loaded from local HF-format directories."""

    def load(self, path: str | Path) -> torch.nn.Module:
        transformers = pytest.importorskip("transformers")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return model.eval()

    @staticmethod
    def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        """``[len(ids), vocab]`` float32 logits of one causal forward over ``ids``."""
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
        return out.logits[0].float()

    def max_step_diff(
        self,
        forward,
        model: torch.nn.Module,
        hf_model: torch.nn.Module,
        steps: list[list[tuple]],
        make_input: _Builder,
        *,
        vocab_size: int,
        all_logits: bool = False,
    ) -> float:
        """Run ``steps`` through ``forward(model, inp)``; compare each row's logits with the oracle.

        A slot's sequence is rebuilt per step as ``history[:num_computed] + tokens``, so a row that
        lowers ``num_computed`` (a rolled-back draft) is compared with the rewritten sequence.
        """
        history: dict[int, list[int]] = {}
        worst = 0.0
        for rows in steps:
            inp = make_input(rows, vocab_size=vocab_size, all_logits=all_logits)
            ours = forward(model, inp)  # [num_logits, vocab]
            taken = 0
            for spec in (Row(*r) for r in rows):
                sequence = history.get(spec.slot, [])[: spec.num_computed] + list(spec.tokens)
                assert len(sequence) == spec.num_computed + len(spec.tokens), "test steps skip tokens"
                history[spec.slot] = sequence
                positions = [spec.num_computed + o for o in spec.logit_offsets(all_logits)]
                expected = self.logits(hf_model, sequence)[positions]  # [n, vocab]
                got = ours[taken : taken + len(positions)]
                taken += len(positions)
                worst = max(worst, float((got - expected).abs().max()))
        return worst


@pytest.fixture
def make_input() -> _Builder:
    return _Builder()


@pytest.fixture(scope="session")
def hf_oracle() -> HFOracle:
    return HFOracle()


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Tiny models gain nothing from intra-op threads; on a busy 2-core machine each op's thread
    barrier can cost ~0.2 ms (measured: a [4, 64] x [64, 128] linear takes 190 us with 2 threads
    while other processes run, 4 us with 1), which turns a 1 s model test into 30 s."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
