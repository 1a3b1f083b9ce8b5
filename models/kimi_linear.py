"""Kimi-Linear (``KimiLinearForCausalLM``): KDA linear attention + MLA full attention, MoE MLPs.

A pre-norm decoder whose layers are each either a KDA mixer (:mod:`tokenstate.models.kda`, per-slot
recurrent + conv state) or an MLA mixer (:mod:`tokenstate.models.mla`, per-slot KV cache), followed
by either a dense gated MLP or a shared-expert MoE (:mod:`tokenstate.models.moe`), as the config's
``layer_types`` / ``mlp_layer_types`` say.

The registered forward reads the step's token ids itself — ``inp.device_tokens.ids`` whenever the
runner sent device ids, else the (checked) host ids — and embeds them through the guarded gather;
this is the "direct read" routing pattern (the dense family delegates instead, NemotronH publishes
a scope). Speculative drafts are supported: the KDA layers checkpoint their conv and delta-rule
state after every draft position, and the slot's next row restores the one after the last accepted
draft (:mod:`tokenstate.models.draft_checkpoints`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tokenstate.contracts import BatchLayout, ConfigError, ForwardInput, IndexPlan, entry_point
from tokenstate.models.dense import EmbeddingTable
from tokenstate.models.draft_checkpoints import DraftPlan, DraftTracker
from tokenstate.models.kda import (
    KimiDeltaAttention,
    RecurrentGroup,
    plan_recurrent_groups,
    recurrent_groups,
)
from tokenstate.models.kimi_linear_config import (
    ARCHITECTURE,
    KDA,
    SPARSE,
    KimiLinearConfig,
    parse_kimi_linear_config,
)
from tokenstate.models.layers import GatedMLP, RMSNorm
from tokenstate.models.mla import MultiHeadLatentAttention
from tokenstate.models.moe import SharedExpertMoE
from tokenstate.models.slot_batch import SlotBatch
from tokenstate.models.step_plan import index_plan, plan_model_indices
from tokenstate.models.weights import load_state, read_config, save_checkpoint, seeded_init
from tokenstate.runtime.kernels import guarded_embedding
from tokenstate.runtime.registry import ModelFactory

__all__ = ["KIMI_LINEAR", "TINY_KIMI_LINEAR", "KimiLinear", "KimiLinearBackbone", "KimiLinearStep", "forward"]

INIT_STD = 0.1
"""Seeded builds draw matrices from N(0, 0.1): 5x HF's 0.02, so a tiny random model's logits are
peaked enough that greedy decoding does not collapse into repeating one token."""

TINY_KIMI_LINEAR: dict[str, Any] = {
    "architectures": [ARCHITECTURE],
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "layer_types": [KDA, "full_attention", KDA, "full_attention"],
    "mlp_layer_types": ["dense", SPARSE, SPARSE, SPARSE],
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.446,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True, slots=True)
class KimiLinearStep:
    """Per-step indices shared by every layer: MLA reads ``batch``, KDA reads ``groups``."""

    batch: SlotBatch | None  # None when the model has no MLA layer
    groups: tuple[RecurrentGroup, ...]  # empty when the model has no KDA layer
    drafts: DraftPlan | None = None  # the step's draft rows and checkpoint restores (KDA layers)


class KimiDecoderLayer(nn.Module):
    """Pre-norm block: ``h += mixer(norm(h)); h += mlp(norm(h))`` (HF names: ``self_attn``, ``block_sparse_moe``)."""

    def __init__(self, config: KimiLinearConfig, index: int) -> None:
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn: KimiDeltaAttention | MultiHeadLatentAttention
        if c.layer_types[index] == KDA:
            self.self_attn = KimiDeltaAttention(
                c.hidden_size, c.linear_num_heads, c.linear_head_dim, c.linear_conv_kernel_dim, c.rms_norm_eps,
                act=c.hidden_act,
            )
        else:
            self.self_attn = MultiHeadLatentAttention(
                c.hidden_size, c.num_attention_heads, q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
                qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
                v_head_dim=c.v_head_dim, bias=c.attention_bias,
            )
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.block_sparse_moe: SharedExpertMoE | GatedMLP
        if c.mlp_layer_types[index] == SPARSE:
            self.block_sparse_moe = SharedExpertMoE(
                c.hidden_size, num_experts=c.num_local_experts, expert_intermediate_size=c.moe_intermediate_size,
                num_shared_experts=c.n_shared_experts, num_groups=c.n_group, topk_groups=c.topk_group,
                top_k=c.num_experts_per_tok, renormalize=c.norm_topk_prob, scaling=c.routed_scaling_factor,
                act=c.hidden_act,
            )
        else:
            self.block_sparse_moe = GatedMLP(c.hidden_size, c.intermediate_size, bias=False, act=c.hidden_act)

    def forward(self, hidden: Tensor, step: KimiLinearStep) -> Tensor:
        normed = self.input_layernorm(hidden)  # [T, hidden]
        if isinstance(self.self_attn, KimiDeltaAttention):
            hidden = hidden + self.self_attn(normed, step.groups, step.drafts)
        else:
            assert step.batch is not None  # built whenever the model has an MLA layer
            hidden = hidden + self.self_attn(normed, step.batch)
        return hidden + self.block_sparse_moe(self.post_attention_layernorm(hidden))


class KimiLinearBackbone(nn.Module):
    """Embedding table, decoder layers and final norm (HF's ``model.*`` parameters)."""

    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.embed_tokens = EmbeddingTable(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KimiDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class KimiLinear(nn.Module):
    """The servable model: backbone + LM head, per-slot state, HF checkpoint names."""

    def __init__(self, config: KimiLinearConfig) -> None:
        super().__init__()
        self.config = config
        self.model = KimiLinearBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.vocab_size: int = config.vocab_size
        self.max_model_len: int = config.max_position_embeddings
        self.eos_token_id: int | None = config.eos_token_ids[0] if config.eos_token_ids else None
        self.eos_token_ids: tuple[int, ...] = config.eos_token_ids  # every id of an eos list stops
        self.num_slots = 0
        self._has_mla = any(t != KDA for t in config.layer_types)
        self._has_kda = KDA in config.layer_types
        self._drafts = DraftTracker()  # which slots' next row restores a draft checkpoint

    def allocate_slots(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ConfigError(f"allocate_slots: num_slots must be a positive int, got {num_slots!r}.")
        for layer in self.model.layers:
            if isinstance(layer.self_attn, KimiDeltaAttention):
                layer.self_attn.allocate_slots(num_slots)
            else:
                layer.self_attn.allocate_slots(num_slots, self.max_model_len)
        self.num_slots = num_slots
        self._drafts.clear()

    def reset_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ConfigError(f"reset_slot: slot {slot} is outside the {self.num_slots} allocated slots.")
        for layer in self.model.layers:
            layer.self_attn.reset_slot(slot)
        # Not the draft tracker: it is the host's planning state, and the runner resets slots in
        # stream order, possibly after the host planned the slot's next rows. A new owner's first
        # row (num_computed == 0) voids the slot's pending checkpoint there (DraftTracker.plan_part).

    def plan_indices(self, layout: BatchLayout) -> IndexPlan:
        """On the host, before the step is launched: the MLA's and the KDA layers' index arrays."""
        attention = recurrent = drafts = None
        if self._has_mla:
            attention = SlotBatch.plan(
                layout, num_slots=self.num_slots, max_model_len=self.max_model_len,
                device=self.lm_head.weight.device,
            )  # fmt: skip
        if self._has_kda:
            recurrent = plan_recurrent_groups(layout, num_slots=self.num_slots)
            drafts = self._drafts.plan_part(layout)
        return index_plan(attention=attention, recurrent=recurrent, drafts=drafts)

    def logits_from_embeddings(self, hidden: Tensor, inp: ForwardInput) -> Tensor:
        """Run the layers on ``[num_tokens, hidden]`` embeddings → ``[num_logits, vocab]`` float32."""
        if self.num_slots == 0:
            raise ConfigError("model has no slots: call model.allocate_slots(num_slots) before forward.")
        step = KimiLinearStep(
            batch=SlotBatch.from_input(inp, num_slots=self.num_slots, max_model_len=self.max_model_len)
            if self._has_mla
            else None,
            groups=recurrent_groups(inp, num_slots=self.num_slots) if self._has_kda else (),
            drafts=self._drafts.plan(inp) if self._has_kda else None,
        )
        for layer in self.model.layers:
            hidden = layer(hidden, step)
        # The final norm is per token, so only the tokens whose logits are read need it.
        return self.lm_head(self.model.norm(hidden[inp.logits_indices])).float()


@entry_point(name="tokenstate.models.kimi_linear.forward")
def forward(model: KimiLinear, inp: ForwardInput) -> Float[Tensor, "num_logits vocab"]:
    """One step of Kimi-Linear: the honoured token ids in, float32 logits at ``inp.logits_indices`` out."""
    if inp.device_tokens is not None:
        ids = inp.device_tokens.ids  # [num_tokens]: authoritative, spliced on the device
    else:
        ids = inp.host_tokens.ids.to(inp.device, non_blocking=True)  # [num_tokens]: all fresh
    with torch.no_grad():
        hidden = guarded_embedding(ids, model.model.embed_tokens.weight)  # [num_tokens, hidden]
        return model.logits_from_embeddings(hidden, inp)


def _checkpoint_view(model: KimiLinear, *, copies: bool) -> dict[str, Tensor]:
    """Every tensor under its HF checkpoint name.

    Stacked experts and the fused q|k|v conv are split back into the checkpoint's per-expert and
    per-projection tensors. With ``copies=False`` these are *views* of the model's storage (loading
    copies into them, so it writes the parameters); saving takes copies, because safetensors
    refuses tensors that share memory.
    """
    view: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "conv_weight":  # [3 * inner, K] -> q/k/v_conv1d.weight [inner, 1, K]
            for proj, part in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                view[f"{prefix}.{proj}_conv1d.weight"] = part.unsqueeze(1)
        elif leaf == "o_norm_weight":
            view[f"{prefix}.o_norm.weight"] = tensor
        elif prefix.endswith(".experts") and leaf in ("w1", "w2", "w3"):  # [experts, out, in]
            for e, expert in enumerate(tensor.unbind(0)):
                view[f"{prefix}.{e}.{leaf}.weight"] = expert
        else:
            view[name] = tensor
    return {name: t.clone() for name, t in view.items()} if copies else view


class _CheckpointModule(nn.Module):
    """Presents :func:`_checkpoint_view` as a module's state dict to the generic weight helpers."""

    def __init__(self, model: KimiLinear, *, copies: bool) -> None:
        super().__init__()
        self._view = _checkpoint_view(model, copies=copies)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:  # type: ignore[override]
        return dict(self._view)


def build(config: dict[str, Any], *, device: torch.device | str = "cpu", seed: int = 0) -> KimiLinear:
    """A model with seeded random weights (HF's init scheme, matrices scaled up; see ``INIT_STD``)."""
    parsed = parse_kimi_linear_config(config)  # validated before anything is allocated
    with torch.device(device):
        model = KimiLinear(parsed)
    seeded_init(model, seed, INIT_STD)
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            if isinstance(layer.self_attn, KimiDeltaAttention):
                # HF's (FLA's) decay init: rates A in [1, 16], step sizes dt in [1e-3, 1e-1].
                attn = layer.self_attn
                rate = torch.empty(attn.A_log.shape).uniform_(1.0, 16.0, generator=generator)
                attn.A_log.copy_(rate.log())
                log_dt = torch.empty(attn.dt_bias.shape).uniform_(-6.907755, -2.302585, generator=generator)
                dt = log_dt.exp().clamp_min(1e-4)
                attn.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
    return model.eval()


def load(path: str | Path, *, device: torch.device | str = "cpu") -> KimiLinear:
    """An HF-format directory (``config.json`` + safetensors, checkpoint names) → model."""
    parsed = parse_kimi_linear_config(read_config(path))
    with torch.device(device):
        model = KimiLinear(parsed)
    load_state(_CheckpointModule(model, copies=False), path, model=ARCHITECTURE)
    return model.eval()


def save(model: KimiLinear, path: str | Path) -> None:
    """Write an HF-format directory that :func:`load` and HF's ``from_pretrained`` both read."""
    save_checkpoint(_CheckpointModule(model, copies=True), path, model.config.to_hf_dict())


KIMI_LINEAR = ModelFactory(
    architectures=(ARCHITECTURE,),
    forward=forward,
    build=build,
    load=load,
    save=save,
    honors_device_token_ids=True,
    presets={"tiny-kimi-linear": TINY_KIMI_LINEAR},
    supports_speculative=True,
    plan_indices=plan_model_indices,
    name="kimi-linear",
)
