"""tokenstate.tools — what a user runs: the CLI (``tokenstate verify``/``gate``/``check``/``specs``/``demo``),
the token gate, the HF oracle and the routing-check front end.

It sits on top of the others (contracts ← runtime ← models ← tools): it may import every package;
nothing imports it back.
"""
