"""Mutants of the tiny-model spec: each reverts one fix."""

from __future__ import annotations

import tiny_model

from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "TINY-1/embeds-host-buffer",
    doc="ids_to_embed returns the raw host buffer, placeholders included.",
)
def embeds_host_buffer(patch: MutantPatch) -> None:
    patch.setattr(tiny_model, "ids_to_embed", lambda inp: inp.host_tokens.placeholder_buffer())
