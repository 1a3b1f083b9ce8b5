"""The HF transformers oracle: score our generations with the reference implementation.

Only imported when a gate asks for the oracle; ``transformers`` is optional (``pip install
'tokenstate[oracle]'``). The oracle runs from a local HF-format directory written by the model's
factory — it never downloads anything.

Teacher forcing: one causal forward of ``prompt + generated[:-1]`` gives HF's greedy choice at every
generated position *given our prefix*. If every choice equals our token, HF's greedy ``generate``
produces exactly our sequence; the first mismatch is exactly where ``generate`` would diverge. So
one forward per request replaces a token-by-token ``generate``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from tokenstate.contracts import ConfigError
from tokenstate.runtime.registry import ModelFactory

__all__ = ["HFOracle", "oracle_available"]


def oracle_available() -> bool:
    """Whether HF transformers can be imported here."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class HFOracle:
    """An HF causal LM holding the same weights as one of our models."""

    def __init__(self, factory: ModelFactory, model: Any) -> None:
        if factory.save is None:
            raise ConfigError(f"model {factory.name!r} cannot save HF-format weights, so it has no oracle.")
        if not oracle_available():
            raise ConfigError(
                "the HF oracle needs transformers: pip install 'tokenstate[oracle]' (transformers==5.18.*)."
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()  # a gate report, not a download log
        with tempfile.TemporaryDirectory(prefix="tokenstate-oracle-") as tmp:
            factory.save(model, Path(tmp))
            try:
                self.model = transformers.AutoModelForCausalLM.from_pretrained(
                    tmp, dtype=torch.float32, local_files_only=True
                ).eval()
            except (ValueError, KeyError, OSError, ImportError) as exc:  # an architecture it has no class for
                reason = " ".join(str(exc).replace(tmp, "the saved directory").split())
                raise ConfigError(
                    f"transformers cannot load the checkpoint model {factory.name!r} saves ({type(exc).__name__}: "
                    f"{reason}), so it has no HF oracle."
                ) from exc

    @torch.inference_mode()
    def greedy_choices(self, prompt: list[int], generated: list[int]) -> list[int]:
        """HF's argmax at each generated position, given ``prompt`` and our earlier tokens."""
        if not generated:
            return []
        ids = torch.tensor([prompt + generated[:-1]])  # [1, len(prompt) + len(generated) - 1]
        logits = self.model(input_ids=ids, use_cache=False).logits[0]  # [seq, vocab]
        return logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
