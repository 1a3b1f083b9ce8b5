"""P1: a checked decode step of the smallest reference model vs the same forward unchecked.

Run: ``python benchmarks/contract_overhead.py [--quick]``. The model is the ``tiny-llama`` preset
(the smallest reference model), with slots allocated; the input is a realistic async decode step: 16
decode rows at mixed sequence lengths, every row spliced (``PLACEHOLDER`` on the host, the real ids
in :class:`~tokenstate.contracts.DeviceTokens`, as the runner's combine step hands them over). Per
checks mode, ``factory.forward(model, inp)`` (the checked entry point) and
``factory.forward.__wrapped__(model, inp)`` (the bare forward) alternate every repetition; the ratio
is the share of a decode step that the checks cost. Target: ``<= 1.02`` in ``boundary`` mode (the
default); ``off`` must be free (``<= 1.01``), ``full`` is reported.

The µs the boundary adds per call are also reported from a no-op forward (``overhead_us`` of the
``no-op`` rows), where nothing hides them.

The value checks the type states run on CPU tensors in every mode (issue 13: ``DeviceTokens`` ids
inside the vocabulary, no placeholder at a fresh ``HostTokens`` position, ``ForwardInput``
``logits_indices`` inside the step) run once per step, where the runner builds the step's states.
Their row times those three checks on this step's tensors against the unchecked decode step,
paired repetition by repetition, and reports ``(step + checks) / step`` with the min/median/max of
the per-repetition ratios. On a CUDA tensor the checks return at once (no device sync): the guarded
embedding checks there.

Runs with one intra-op thread: a decode step of this model is a few hundred tiny ops, and on a
shared 2-core machine an op that opens the OpenMP pool can wait for a descheduled core, which would
swamp a 1 % difference with scheduler noise. Both sides of every ratio run the same way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import interleaved, print_table, row

import tokenstate.models  # noqa: F401  (registers the reference models)
from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    checks_mode,
    entry_point,
    forward_input as forward_input_module,
    stale_position_mask,
    tokens as tokens_module,
)
from tokenstate.runtime import registry

PRESET = "tiny-llama"
NUM_ROWS = 16
TARGETS = {"off": 1.01, "boundary": 1.02, "full": float("inf")}


def decode_step_input(vocab_size: int, num_rows: int = NUM_ROWS) -> ForwardInput:
    """An async decode step: ``num_rows`` one-token rows in slots ``0..num_rows-1``, all spliced."""
    gen = torch.Generator().manual_seed(0)
    i32 = torch.int32
    qsl = torch.arange(num_rows + 1, dtype=i32)  # [num_rows + 1]
    seq_lens = torch.arange(num_rows, dtype=i32) * 5 + 24  # [num_rows] 24 .. 99: mixed lengths
    prefill_lens = seq_lens - 7  # [num_rows] every row past its prompt: spliced
    slots = torch.arange(num_rows, dtype=i32)  # [num_rows]
    num_drafts = torch.zeros(num_rows, dtype=i32)  # [num_rows]
    stale = stale_position_mask(qsl, seq_lens, prefill_lens, num_drafts)  # [num_rows] bool, all True
    host = HostTokens(torch.full((num_rows,), PLACEHOLDER, dtype=i32), stale, qsl, slots)
    real_ids = torch.randint(3, vocab_size, (num_rows,), generator=gen, dtype=i32)  # [num_rows]
    device = DeviceTokens.from_combine(real_ids, vocab_size=vocab_size)
    logits_indices = torch.arange(num_rows)  # [num_rows] int64: every decode row samples
    layout = BatchLayout(qsl, seq_lens, slots, num_drafts, logits_indices)
    positions = (seq_lens - 1).long()  # [num_rows] int64
    return ForwardInput(host, device, positions, layout, logits_indices.clone(), slots.long())


def _noop(model: Any, inp: ForwardInput) -> Tensor:
    return model.logits_buffer


noop_checked = entry_point(_noop)


class _NoOpModel:
    """Returns a preallocated ``[num_logits, vocab]``: isolates the boundary's own µs per call."""

    def __init__(self, vocab_size: int, num_logits: int) -> None:
        self.vocab_size = vocab_size
        self.logits_buffer = torch.zeros(num_logits, vocab_size)  # [num_logits, vocab]


def value_checks_row(bare: Any, model: Any, inp: ForwardInput, host_ids: torch.Tensor, repeats: int) -> dict[str, Any]:
    """``(step + per-step value checks) / step``, paired per repetition (see the module docs);
    ``host_ids`` is the step's raw host buffer, read before any forward got the step."""
    ids, vocab = inp.device_tokens.ids, model.vocab_size  # type: ignore[union-attr]
    stale = inp.host_tokens.stale.numpy()

    def checks() -> None:
        tokens_module._check_in_vocabulary(ids, vocab)
        tokens_module._check_fresh_positions(host_ids, stale)
        forward_input_module._check_logits_in_step(inp.logits_indices, inp.num_tokens)

    step_us, check_us, ratios = [], [], []
    for _ in range(3):  # warm-up
        bare(model, inp)
        checks()
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(2):
            bare(model, inp)
        step = (time.perf_counter() - start) / 2
        start = time.perf_counter()
        for _ in range(20):
            checks()
        check = (time.perf_counter() - start) / 20
        step_us.append(step * 1e6)
        check_us.append(check * 1e6)
        ratios.append((step + check) / step)
    ours = statistics.median(step_us) + statistics.median(check_us)
    return row(
        f"decode step + CPU value checks of the type states, {PRESET}, {NUM_ROWS} rows",
        ours,
        statistics.median(step_us),
        unit="µs per step",
        target="<= 1.02",
        ok=statistics.median(ratios) <= 1.02,
        checks_us=round(statistics.median(check_us), 2),
        ratio_min_median_max=(round(min(ratios), 4), round(statistics.median(ratios), 4), round(max(ratios), 4)),
    )


def run(quick: bool = False) -> list[dict[str, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    factory = registry.resolve(PRESET)
    model = factory.build_preset(PRESET)
    model.allocate_slots(NUM_ROWS)
    inp = decode_step_input(model.vocab_size)
    host_ids = inp.host_tokens.placeholder_buffer()  # [num_tokens]: read as the combine step does, before any forward
    noop_model = _NoOpModel(model.vocab_size, NUM_ROWS)
    checked, bare = factory.forward, factory.forward.__wrapped__
    rows = []
    try:
        with torch.inference_mode():
            for mode in ("off", "boundary", "full"):
                with checks_mode(mode):
                    step = interleaved(
                        {"checked": lambda: checked(model, inp), "bare": lambda: bare(model, inp)},
                        # Alternate every 2 forwards: a drift of the shared machine then hits
                        # both sides alike, and the median of many samples stays put.
                        repeats=81 if quick else 401,
                        inner=2,
                    )
                    noop = interleaved(
                        {
                            "checked": lambda: noop_checked(noop_model, inp),
                            "bare": lambda: _noop(noop_model, inp),
                        },
                        repeats=9 if quick else 31,
                        inner=200 if quick else 2000,
                    )
                ours, base = step["checked"]["median"], step["bare"]["median"]
                limit = TARGETS[mode]
                rows.append(
                    row(
                        f"checked / unchecked decode step, {PRESET}, {NUM_ROWS} rows, checks={mode}",
                        ours,
                        base,
                        unit="µs per forward",
                        target="report" if limit == float("inf") else f"<= {limit}",
                        ok=ours / base <= limit,
                        overhead_us=round(noop["checked"]["median"] - noop["bare"]["median"], 2),
                        checked_min_max_us=(round(step["checked"]["min"], 1), round(step["checked"]["max"], 1)),
                        bare_min_max_us=(round(step["bare"]["min"], 1), round(step["bare"]["max"], 1)),
                    )
                )
            rows.append(value_checks_row(bare, model, inp, host_ids, 81 if quick else 401))
    finally:
        torch.set_num_threads(threads)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    results = run(args.quick)
    print_table(results)
    for r in results:
        if "overhead_us" in r:
            print(f"  {r['measure']}: boundary cost {r['overhead_us']} µs per call (no-op forward)")
        else:
            print(f"  {r['measure']}: checks {r['checks_us']} µs; ratio min/median/max {r['ratio_min_median_max']}")


if __name__ == "__main__":
    main()
