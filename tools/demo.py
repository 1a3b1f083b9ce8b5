"""``tokenstate demo``: the stale-host-ids contract at work on one hand-made async step."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console

from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    StaleHostTokensError,
    stale_position_mask,
)


def demo_step() -> tuple[ForwardInput, torch.Tensor]:
    """Two rows on the async path: a prefill chunk (fresh) and a decode row (its id on the device)."""
    qsl = torch.tensor([0, 4, 5], dtype=torch.int32)  # [num_rows + 1]
    seq_lens = torch.tensor([4, 9], dtype=torch.int32)  # [num_rows]
    prefill_lens = torch.tensor([6, 8], dtype=torch.int32)  # [num_rows] gathered by slot
    slots = torch.tensor([3, 1], dtype=torch.int32)  # [num_rows]
    real = torch.tensor([17, 4, 99, 23, 42], dtype=torch.int32)  # [num_tokens] what the device knows
    stale = stale_position_mask(qsl, seq_lens, prefill_lens)  # [num_tokens] bool
    host = HostTokens(torch.where(stale, PLACEHOLDER, real), stale, qsl, slots)
    layout = BatchLayout(qsl, seq_lens, slots, torch.zeros(2, dtype=torch.int32), torch.tensor([4]))
    inp = ForwardInput(
        host_tokens=host,
        device_tokens=DeviceTokens.from_combine(real, vocab_size=128),
        positions=torch.tensor([0, 1, 2, 3, 8]),
        layout=layout,
        logits_indices=torch.tensor([4]),
        slots=slots.long(),
    )
    return inp, real


def run_demo(console: Console | None = None) -> int:
    console = console or Console()
    inp, real = demo_step()
    console.print("[bold]An async step:[/] row 0 is a prefill chunk, row 1 a decode row.")
    console.print(f"  host buffer   {inp.host_tokens.placeholder_buffer().tolist()}  (PLACEHOLDER = {PLACEHOLDER})")
    console.print(f"  stale mask    {inp.host_tokens.stale.tolist()}")
    console.print(f"  device ids    {inp.device_tokens.ids.tolist() if inp.device_tokens else None}")
    try:
        _ = inp.host_tokens.ids
    except StaleHostTokensError as exc:
        console.print(f"[green]refused[/] a stale host read: rows {list(exc.rows)}, slots {list(exc.slots)}")
    else:
        console.print("[red]a stale host read was NOT refused[/]")
        return 1
    fresh_row = inp.host_tokens.row_ids(0).tolist()
    ok = inp.embedding_ids().tolist() == real.tolist() and fresh_row == real[:4].tolist()
    console.print(f"[green]readable[/] fresh row 0: {fresh_row}; embedding ids: {inp.embedding_ids().tolist()}")
    console.print("[bold green]contract checks passed[/]" if ok else "[bold red]contract checks failed[/]")
    return 0 if ok else 1


def run_demo_command(args: argparse.Namespace) -> int:
    """``tokenstate demo``."""
    return run_demo()
