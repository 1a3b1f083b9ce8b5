"""NemotronH (``NemotronHForCausalLM``): a hybrid of Mamba2, attention, MLP and MoE layers.

The registered forward opens a :class:`~tokenstate.models.scope.StepScope` that publishes the
step's token ids — the *device* ids whenever the runner sent them — and the embedding deep inside
the backbone (:class:`~tokenstate.models.scope.ScopedEmbedding`) consumes that scope instead of
receiving ids as an argument: the delegation pattern of real engines, which the routing checker
must see through. Hence ``honors_device_token_ids=True``. Speculative drafts are supported: the
Mamba2 layers checkpoint their conv/SSM state after every draft position and the slot's next row
restores the one after the last accepted draft (:mod:`tokenstate.models.draft_checkpoints`).

Checkpoints are NemotronH's HF format: ``backbone.*`` names and one tensor pair per expert
(``backbone.layers.1.mixer.experts.0.up_proj.weight``), which is what HF writes on save. As in
HF, ``tie_word_embeddings`` never ties a head the checkpoint holds (a warning says so); a tied
checkpoint *without* ``lm_head.weight`` is served with the embedding as its head (HF 5.18 reports the
head missing and leaves it random). Multi-token-prediction layers (``mtp.*``) are skipped with a
warning, as HF skips them; legacy layer names (``mamba``, ``attention``) are mapped as HF maps them.

**The Mamba2 step size.** ``dt = softplus(x + dt_bias)`` is clamped to the config's
``time_step_limit`` (default ``(0, inf)``: no clamp) on every step, prefill and decode alike, as
mamba_ssm's kernels take ``dt_limit``. The peers differ here: HF transformers' torch path clamps a
*prefill*'s dt from below at ``time_step_min`` (its decode path does not clamp), and vLLM clamps
to ``(0, inf)`` whatever the config says: a finite upper bound is applied here and ignored by both
peers (a warning says so at build). Where a trained checkpoint's dt falls below
``time_step_min`` during a prefill, HF's tokens can therefore differ from these (and from HF's own
decode of the same positions); ``tokenstate gate --model DIR`` shows it. The reference preset
sets ``time_step_min = 0``, where all of them agree.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tokenstate.contracts import BatchLayout, ConfigError, ForwardInput, IndexPlan, entry_point
from tokenstate.models.draft_checkpoints import DraftTracker
from tokenstate.models.layers import RMSNorm
from tokenstate.models.mamba2 import Mamba2Mixer, RecurrentBatch
from tokenstate.models.nemotron_h_blocks import NemotronHBlock, NemotronHStep
from tokenstate.models.nemotron_h_config import ARCHITECTURE, parse_nemotron_h_config
from tokenstate.models.scope import ScopedEmbedding, StepScope
from tokenstate.models.slot_batch import SlotBatch
from tokenstate.models.step_plan import index_plan, plan_model_indices
from tokenstate.models.weights import (
    load_state,
    read_config,
    save_checkpoint,
    seeded_init,
    tensor_names,
)
from tokenstate.runtime.registry import ModelFactory

__all__ = [
    "NEMOTRON_H_FACTORY",
    "TINY_NEMOTRON_H",
    "NemotronHBackbone",
    "NemotronHForCausalLM",
    "build_nemotron_h",
    "load_nemotron_h",
    "nemotron_h_forward",
    "save_nemotron_h",
]

INIT_SCALE: Final = 5.0
"""Random builds draw matrices with ``INIT_SCALE * initializer_range`` std: at HF's default scale a
tiny model's logits are nearly flat and greedy decoding just repeats the last input token."""

_TIED_HEAD: Final = {"lm_head.weight": "backbone.embeddings.weight"}


class NemotronHBackbone(nn.Module):
    """Scope-fed embedding, the hybrid layers and the final norm (``backbone.*`` parameters)."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = ScopedEmbedding(s["vocab_size"], s["hidden_size"])
        self.layers = nn.ModuleList(NemotronHBlock(t, s) for t in s["layers_block_type"])
        self.norm_f = RMSNorm(s["hidden_size"], s["layer_norm_epsilon"])
        self.max_model_len: int = s["max_position_embeddings"]
        self.num_slots = 0
        self._drafts = DraftTracker()  # which slots' next row restores a draft checkpoint

    def plan_indices(self, layout: BatchLayout) -> IndexPlan:
        """On the host, before the step is launched: the attention's and the mixers' index arrays."""
        attention = SlotBatch.plan(
            layout, num_slots=self.num_slots, max_model_len=self.max_model_len,
            device=self.embeddings.weight.device,
        )  # fmt: skip
        return index_plan(
            attention=attention, recurrent=RecurrentBatch.plan(layout), drafts=self._drafts.plan_part(layout)
        )

    def forward(self, inp: ForwardInput) -> Tensor:
        """``[num_logits, hidden]`` final-normed states at ``inp.logits_indices``."""
        if self.num_slots == 0:
            raise ConfigError(
                "NemotronH has no slots: call model.allocate_slots(num_slots) before forward."
            )
        step = NemotronHStep(
            attention=SlotBatch.from_input(
                inp, num_slots=self.num_slots, max_model_len=self.max_model_len
            ),
            recurrent=RecurrentBatch.from_input(inp, self._drafts),
        )
        hidden = self.embeddings()  # [num_tokens, hidden], ids from the open StepScope
        for layer in self.layers:
            hidden = layer(hidden, step)
        return self.norm_f(hidden[inp.logits_indices])

    def allocate_slots(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ConfigError(
                f"allocate_slots: num_slots must be a positive int, got {num_slots!r}."
            )
        for layer in self.layers:
            layer.allocate_slots(num_slots, self.max_model_len)
        self.num_slots = num_slots
        self._drafts.clear()

    def reset_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.num_slots:
            raise ConfigError(
                f"reset_slot: slot {slot!r} is outside the {self.num_slots} allocated slots."
            )
        for layer in self.layers:
            layer.reset_slot(slot)
        # Not the draft tracker: it is the host's planning state, and the runner resets slots in
        # stream order, possibly after the host planned the slot's next rows. A new owner's first
        # row (num_computed == 0) voids the slot's pending checkpoint there (DraftTracker.plan_part).


class NemotronHForCausalLM(nn.Module):
    """The backbone plus the LM head (tied to the embedding when the config says so)."""

    def __init__(self, settings: dict[str, Any], hf_config: Mapping[str, Any]) -> None:
        super().__init__()
        self.settings = settings
        self.backbone = NemotronHBackbone(settings)
        self.lm_head = nn.Linear(settings["hidden_size"], settings["vocab_size"], bias=False)
        if settings["tie_word_embeddings"]:
            self.lm_head.weight = self.backbone.embeddings.weight
        self.hf_config = {**hf_config, "architectures": [ARCHITECTURE], "model_type": "nemotron_h"}
        self.vocab_size: int = settings["vocab_size"]
        self.max_model_len: int = settings["max_position_embeddings"]
        self.eos_token_id: int | None = settings["eos_token_id"]
        self.eos_token_ids: tuple[int, ...] = settings["eos_token_ids"]  # every id of an eos list stops
        self.requires_grad_(False)  # inference only: state updates must not build autograd graphs

    def compute_logits(self, inp: ForwardInput) -> Tensor:
        """``[num_logits, vocab]`` float32 logits at ``inp.logits_indices``."""
        return self.lm_head(self.backbone(inp)).float()

    def allocate_slots(self, num_slots: int) -> None:
        self.backbone.allocate_slots(num_slots)

    def plan_indices(self, layout: BatchLayout) -> IndexPlan:
        return self.backbone.plan_indices(layout)

    def reset_slot(self, slot: int) -> None:
        self.backbone.reset_slot(slot)


@entry_point(name="NemotronHForCausalLM.forward")
def nemotron_h_forward(
    model: NemotronHForCausalLM, inp: ForwardInput
) -> Float[Tensor, "num_logits vocab"]:
    """One step: publish the step's ids in a scope, run the backbone, return the logits."""
    with torch.no_grad(), StepScope(inp):
        return model.compute_logits(inp)


def _aliases(settings: Mapping[str, Any]) -> dict[str, str] | None:
    return dict(_TIED_HEAD) if settings["tie_word_embeddings"] else None


def build_nemotron_h(
    config: Mapping[str, Any], *, device: torch.device | str = "cpu", seed: int = 0
) -> NemotronHForCausalLM:
    """A model with seeded random weights from an HF-style config dict (validated first)."""
    settings = parse_nemotron_h_config(config)
    init_range = config.get("initializer_range", 0.02)
    low = max(settings["time_step_min"], settings["time_step_floor"])
    high = max(settings["time_step_max"], low)
    if (
        isinstance(init_range, bool)
        or not isinstance(init_range, int | float)
        or not init_range > 0
    ):
        raise ConfigError(f"initializer_range must be a positive number, got {init_range!r}.")
    if low <= 0:
        raise ConfigError(
            "time_step_min and time_step_floor are both 0: a random build draws dt log-uniformly "
            "from [max(time_step_min, time_step_floor), time_step_max]; make one of them > 0."
        )
    with torch.device(device):
        model = NemotronHForCausalLM(settings, config)
    seeded_init(model, seed, INIT_SCALE * float(init_range))
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, Mamba2Mixer):
                continue
            heads, kernel = module.num_heads, module.conv_kernel
            module.A_log.copy_(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
            module.D.fill_(1.0)
            # dt log-uniform in [low, high]; dt_bias is its inverse softplus.
            u = torch.rand(heads, generator=generator)
            dt = torch.exp(u * (math.log(high) - math.log(low)) + math.log(low))
            module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            bound = kernel**-0.5  # PyTorch's default conv scale: the short conv must not vanish
            w = (torch.rand(module.conv1d.weight.shape, generator=generator) * 2 - 1) * bound
            module.conv1d.weight.copy_(w)
    return model


_MTP: Final = "mtp."  # multi-token-prediction layers: HF's NemotronH skips them on load


def load_nemotron_h(
    path: str | Path, *, device: torch.device | str = "cpu"
) -> NemotronHForCausalLM:
    """An HF-format NemotronH directory (config.json + safetensors, ``backbone.*`` names)."""
    config = read_config(path)
    settings = parse_nemotron_h_config(config)
    with torch.device(device):
        model = NemotronHForCausalLM(settings, config)
    names = tensor_names(path)
    fused = sorted(n for n in names if re.search(r"\.mixer\.experts\.(gate_up_proj|up_proj|down_proj)$", n))
    if fused:
        raise ConfigError(
            f"{path}: fused expert tensors ({', '.join(fused[:2])}{', ...' if len(fused) > 2 else ''}: HF's "
            "in-memory layout) are not read; write one tensor pair per expert "
            "(backbone.layers.N.mixer.experts.E.up_proj.weight), as HF's save_pretrained does."
        )
    skipped = sorted(n for n in names if n.startswith(_MTP))
    if skipped:
        warnings.warn(
            f"{path}: the checkpoint's {len(skipped)} multi-token-prediction tensor(s) "
            f"({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''}) are not loaded, as HF "
            "skips them: the base model is served.",
            UserWarning,
            stacklevel=2,
        )
    if settings["tie_word_embeddings"] and "lm_head.weight" in names:
        # HF's NemotronH declares no tied weights: a head in the checkpoint is the head it serves.
        embeddings = model.backbone.embeddings.weight
        model.lm_head.weight = nn.Parameter(embeddings.detach().clone(), requires_grad=False)
        load_state(model, path, model=ARCHITECTURE, ignored=(_MTP,))
        if torch.equal(model.lm_head.weight, embeddings):
            model.lm_head.weight = embeddings  # tied after all (save_nemotron_h writes the copy)
        else:
            warnings.warn(
                f"{path}: tie_word_embeddings=true is ignored, as HF's NemotronH ignores it: the "
                "checkpoint's own lm_head.weight is the LM head.",
                UserWarning,
                stacklevel=2,
            )
        return model
    load_state(model, path, aliases=_aliases(settings), model=ARCHITECTURE, ignored=(_MTP,))
    return model


def save_nemotron_h(model: NemotronHForCausalLM, path: str | Path) -> None:
    """Write an HF-format directory that ``transformers`` loads as ``NemotronHForCausalLM``."""
    if not isinstance(model, NemotronHForCausalLM):
        raise ConfigError(
            f"save_nemotron_h: expected a NemotronHForCausalLM, got {type(model).__name__}."
        )
    # lm_head.weight is written even when tied: HF's NemotronH declares no tied weights, so it
    # would leave a missing head randomly initialised. safetensors refuses shared storage, so a
    # tied head is saved from a copy and re-tied afterwards.
    tied = model.lm_head.weight
    if model.settings["tie_word_embeddings"]:
        model.lm_head.weight = nn.Parameter(tied.detach().clone(), requires_grad=False)
    try:
        save_checkpoint(model, path, model.hf_config)
    finally:
        model.lm_head.weight = tied


TINY_NEMOTRON_H: Final[Mapping[str, Any]] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "layers_block_type": ["linear_attention", "mlp", "full_attention", "linear_attention", "moe"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "chunk_size": 16,
    # HF's torch prefill path clamps dt at time_step_min while its decode path does not; we follow
    # time_step_limit in both. At 0 the two HF paths agree, so this preset is a clean HF oracle.
    "time_step_min": 0.0,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "max_position_embeddings": 1024,
    "eos_token_id": 2,
    "bos_token_id": 1,
    "pad_token_id": 0,
}
"""The ``tiny-nemotron-h`` preset: every layer type, chunked scans past 16 tokens."""

NEMOTRON_H_FACTORY: Final = ModelFactory(
    architectures=(ARCHITECTURE,),
    forward=nemotron_h_forward,
    build=build_nemotron_h,
    load=load_nemotron_h,
    save=save_nemotron_h,
    honors_device_token_ids=True,
    presets={"tiny-nemotron-h": TINY_NEMOTRON_H},
    preset_seed=0,
    supports_speculative=True,
    plan_indices=plan_model_indices,
    name="nemotron-h",
)
