"""Per-call cost of a checked entry point vs the same forward unchecked, for each checks mode.

Run: ``python benchmarks/contract_overhead.py [--quick]``. Prints µs per call and the ratio,
measured side by side (interleaved) in one run. The forward is a realistic decode step of a small
model (embedding + two mixing layers + lm head over 16 decode rows), so the ratio is the share of a
decode step that the checks cost; the issue's target is ≤ 1.02 in ``boundary`` mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import interleaved, print_table, row  # noqa: E402

from tokenstate.contracts import (  # noqa: E402
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    checks_mode,
    entry_point,
    stale_position_mask,
)


class SmallLM(torch.nn.Module):
    vocab_size = 512

    def __init__(self, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(self.vocab_size, hidden)
        self.mix = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, self.vocab_size)


def _forward(model: SmallLM, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    x = model.embed(inp.embedding_ids())  # [num_tokens, hidden]
    for layer in model.mix:
        x = x + torch.tanh(layer(x))
    return model.head(x[inp.logits_indices])


checked = entry_point(_forward)


def decode_step_input(num_rows: int = 16) -> ForwardInput:
    qsl = torch.arange(num_rows + 1, dtype=torch.int32)  # [num_rows + 1]
    seq = torch.full((num_rows,), 40, dtype=torch.int32)  # [num_rows]
    pre = torch.full((num_rows,), 32, dtype=torch.int32)  # [num_rows]
    slots = torch.arange(num_rows, dtype=torch.int32)  # [num_rows]
    stale = stale_position_mask(qsl, seq, pre)  # [num_rows] all stale: pure decode
    host = HostTokens(torch.full((num_rows,), -1, dtype=torch.int32), stale, qsl, slots)
    device = DeviceTokens.from_combine(torch.randint(0, 512, (num_rows,), dtype=torch.int32), vocab_size=512)
    layout = BatchLayout(qsl, seq, slots, torch.zeros(num_rows, dtype=torch.int32), torch.arange(num_rows))
    return ForwardInput(host, device, (seq - 1).long(), layout, torch.arange(num_rows), slots.long())


def run(quick: bool = False) -> list[dict]:
    torch.manual_seed(0)
    model, inp = SmallLM().eval(), decode_step_input()
    rows = []
    with torch.inference_mode():
        for mode in ("off", "boundary", "full"):
            with checks_mode(mode):
                timing = interleaved(
                    {"checked": lambda: checked(model, inp), "unchecked": lambda: _forward(model, inp)},
                    repeats=7 if quick else 21,
                    inner=50 if quick else 200,
                )
            ours, base = timing["checked"]["median"], timing["unchecked"]["median"]
            target = {"off": "<= 1.01", "boundary": "<= 1.02", "full": "report"}[mode]
            limit = {"off": 1.01, "boundary": 1.02, "full": float("inf")}[mode]
            rows.append(
                row(
                    f"checked/unchecked decode step, checks={mode}",
                    ours,
                    base,
                    unit="µs per call",
                    target=target,
                    ok=ours / base <= limit,
                    overhead_us=round(ours - base, 2),
                    min_max_us=(round(timing["checked"]["min"], 1), round(timing["checked"]["max"], 1)),
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = run(args.quick)
    print_table(results)
    for r in results:
        print(f"  {r['measure']}: +{r['overhead_us']} µs per call")


if __name__ == "__main__":
    main()
