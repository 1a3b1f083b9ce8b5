"""The shared dense decoder: embed → N pre-norm blocks → final norm → LM head.

:class:`DenseModel` is the one place a dense-family model turns a step's token ids into hidden
states, and it does so through :meth:`DenseModel.embed`, which reads ``inp.embedding_ids()`` (the
device ids whenever the runner sent them) and gathers through the runtime's guarded embedding. Model
families reuse it by delegation — Llama uses it as is; other families may pass their own layers
(anything with ``forward(hidden, step)`` and optional ``allocate_slots`` / ``reset_slot``) — so
every one of them inherits the honoured route instead of restating it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from tokenstate.contracts import BatchLayout, ConfigError, ForwardInput, IndexPlan
from tokenstate.models.compiled import OpaqueSites, compile_available, compiled_step
from tokenstate.models.fused_linear import FusedProjection
from tokenstate.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, SlotAttention
from tokenstate.models.slot_batch import SlotBatch
from tokenstate.models.step_plan import index_plan
from tokenstate.runtime.kernels import guarded_embedding

__all__ = ["DenseConfig", "DenseDecoderLayer", "DenseForCausalLM", "DenseModel", "DenseStep", "EmbeddingTable"]


@dataclass(frozen=True, slots=True)
class DenseConfig:
    """The math of a Llama-style dense decoder (already validated; see tokenstate.models.config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class DenseStep:
    """What every layer of one step shares: the input, its slot indices and rotary angles."""

    inp: ForwardInput
    batch: SlotBatch
    cos: Tensor  # [num_tokens, 1, head_dim] float32
    sin: Tensor  # [num_tokens, 1, head_dim] float32, signed (see RotaryEmbedding.cos_sin)


class EmbeddingTable(nn.Module):
    """Holds the ``[vocab, hidden]`` embedding weight under HF's name; it has no forward of its own.

    Embedding goes through :meth:`DenseModel.embed` (guarded gather of the honoured ids) — a plain
    ``nn.Embedding`` call would read garbage for a placeholder id instead of raising.
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))  # [vocab, hidden]


class DenseDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``."""

    def __init__(self, config: DenseConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SlotAttention(
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, bias=config.attention_bias,
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, bias=config.mlp_bias, act=config.hidden_act
        )

    def forward(self, hidden: Tensor, step: DenseStep) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), step.cos, step.sin, step.batch)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def make_opaque(self, sites: OpaqueSites) -> None:
        """Make the layer compile: attention opaque, projections traced or opaque."""
        self.self_attn.make_opaque(sites)
        self.mlp.make_opaque(sites)

    def projections(self) -> list[tuple[FusedProjection, tuple[nn.Linear, ...]]]:
        """Each fused projection of the layer with the linears it computes."""
        return [*self.self_attn.projections(), *self.mlp.projections()]

    def allocate_slots(self, num_slots: int, max_model_len: int) -> None:
        self.self_attn.allocate_slots(num_slots, max_model_len)

    def reset_slot(self, slot: int, written: int | None = None) -> None:
        self.self_attn.reset_slot(slot, written)


class DenseModel(nn.Module):
    """Embedding, decoder layers and final norm (HF's ``model.*`` parameters)."""

    def __init__(self, config: DenseConfig, layers: Sequence[nn.Module] | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = EmbeddingTable(config.vocab_size, config.hidden_size)
        if layers is None:
            layers = [DenseDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings,
            self.embed_tokens.weight.device,
        )
        self.num_slots = 0
        self._written = np.zeros(0, dtype=np.int64)  # [num_slots], see reset_slot
        self._compiled_layers: Callable[[Tensor, DenseStep], Tensor] | None = None  # see compile_layers
        self._projections: list[tuple[FusedProjection, tuple[nn.Linear, ...]]] = []  # compiled: re-checked per step
        self._sites: OpaqueSites | None = None  # compiled: the opaque calls of this model's graph

    def embed(self, inp: ForwardInput) -> Tensor:
        """``[num_tokens, hidden]``: the honoured ids (device ids when present), guarded gather."""
        return guarded_embedding(inp.embedding_ids(), self.embed_tokens.weight)

    def plan_indices(self, layout: BatchLayout) -> IndexPlan:
        """On the host, before the step is launched: the attention's index arrays."""
        return index_plan(attention=SlotBatch.plan(
            layout, num_slots=self.num_slots, max_model_len=self.config.max_position_embeddings,
            device=self.embed_tokens.weight.device,
        ))  # fmt: skip

    def prepare_step(self, inp: ForwardInput) -> DenseStep:
        if self.num_slots == 0:
            raise ConfigError("model has no slots: call model.allocate_slots(num_slots) before forward.")
        batch = SlotBatch.from_input(
            inp, num_slots=self.num_slots, max_model_len=self.config.max_position_embeddings
        )
        batch.note_writes(self._written)
        cos, sin = self.rotary.cos_sin(inp.positions)
        return DenseStep(inp, batch, cos, sin)

    def forward(self, inp: ForwardInput) -> Tensor:
        """``[num_logits, hidden]``: final-normed hidden states at ``inp.logits_indices``."""
        hidden = self.embed(inp)  # [num_tokens, hidden]
        step = self.prepare_step(inp)
        if self._compiled_layers is None or hidden.shape[0] < 2 or torch.is_grad_enabled():
            # One token runs eagerly: the graph is compiled for any count from 2 on (PyTorch
            # specialises sizes 0 and 1, so a one-token step would cost a second compilation).
            # So does grad mode: the graph's GEMMs read weight copies autograd cannot reach.
            hidden = self.run_layers(hidden, step)
        else:
            for projection, linears in self._projections:
                projection.prepare(linears)  # the graph reads these copies: make each current first
            layer_step = DenseStep(None, None, step.cos, step.sin)  # type: ignore[arg-type]
            for t in (hidden, step.cos, step.sin):
                torch._dynamo.mark_dynamic(t, 0)  # the token count; every other size stays static
            # The graph sees only the rotary angles; the opaque attention reads the step's slot
            # batch from the step context, so a new run structure is not a recompilation.
            with compiled_step(self._sites, step.batch):
                hidden = self._compiled_layers(hidden, layer_step)
        # The norm is per token, so only the tokens whose logits are read need it.
        return self.norm(hidden[inp.logits_indices])

    def run_layers(self, hidden: Tensor, step: DenseStep) -> Tensor:
        """``[num_tokens, hidden]`` through every decoder layer (what :meth:`compile_layers` compiles)."""
        for layer in self.layers:
            hidden = layer(hidden, step)
        return hidden

    def compile_layers(self) -> None:
        """Run the decoder layers as one ``torch.compile`` graph from the next forward on.

        Norms, rotary, SiLU·up and residual adds fuse into inductor's loops. Each projection reads
        weights re-checked before every compiled call (traced on its transposed copy, or an opaque
        op when packed) and the slot attention is an opaque op (:mod:`tokenstate.models.compiled`),
        so weight updates and each step's slot runs need no recompilation. The token count is the
        one dynamic size: the first forward of two or more tokens compiles (seconds), and no later
        one does; one-token steps and forwards in grad mode run eagerly. Only
        :class:`DenseDecoderLayer` stacks compile; a copy or pickle of the model runs eagerly.
        """
        others = sorted({type(layer).__name__ for layer in self.layers if not isinstance(layer, DenseDecoderLayer)})
        if others:
            raise ConfigError(f"compile: only dense decoder layers compile, this model has {', '.join(others)}.")
        compile_available()
        self._sites = OpaqueSites()  # ids in layer order: one graph for every model of this shape
        for layer in self.layers:
            layer.make_opaque(self._sites)
        self._projections = [p for layer in self.layers for p in layer.projections()]
        self._compiled_layers = torch.compile(self.run_layers)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_compiled_layers"] = None  # a copy runs eagerly: the compiled graph calls the original
        state["_projections"], state["_sites"] = [], None
        return state

    def allocate_slots(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots < 1:
            raise ConfigError(f"allocate_slots: num_slots must be a positive int, got {num_slots!r}.")
        for layer in self.layers:
            if hasattr(layer, "allocate_slots"):
                layer.allocate_slots(num_slots, self.config.max_position_embeddings)
        self.num_slots = num_slots
        # Per slot, one past the last cache position any step wrote since the slot's last reset.
        self._written = np.zeros(num_slots, dtype=np.int64)  # [num_slots]

    def reset_slot(self, slot: int) -> None:
        """Free a slot for a new request: every cache cell the previous one wrote is zeroed again.

        Only cells ``[0, written)`` can differ from the zeros the caches were allocated with, so
        only those are cleared (a tiny model's full-slot zeroing cost 8 % of a 16-request prefill).
        """
        if not 0 <= slot < self.num_slots:
            raise ConfigError(f"reset_slot: slot {slot} is outside the {self.num_slots} allocated slots.")
        written, self._written[slot] = int(self._written[slot]), 0
        for layer in self.layers:
            if isinstance(layer, DenseDecoderLayer):
                layer.reset_slot(slot, written)
            elif hasattr(layer, "reset_slot"):
                layer.reset_slot(slot)


class DenseForCausalLM(nn.Module):
    """A :class:`DenseModel` plus the LM head (tied to the embedding when the config says so)."""

    def __init__(self, config: DenseConfig, hf_config: dict, model: DenseModel | None = None) -> None:
        super().__init__()
        self.model = model if model is not None else DenseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.hf_config = dict(hf_config)  # written back by save()
        self.vocab_size: int = config.vocab_size
        self.max_model_len: int = config.max_position_embeddings
        self.eos_token_id: int | None = config.eos_token_id
        self._head = FusedProjection()  # lm_head, pre-packed where that pays
        self.tie_weights()

    def projections(self) -> list[tuple[FusedProjection, tuple[nn.Linear, ...]]]:
        """The LM head's projection (the layers list their own)."""
        return [(self._head, (self.lm_head,))]

    def prepack_linears(self) -> None:
        self._head.prepare((self.lm_head,))

    def compile_layers(self) -> None:
        """Compile the decoder stack (:meth:`DenseModel.compile_layers`); the LM head stays eager."""
        self.model.compile_layers()

    def tie_weights(self) -> None:
        if self.model.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def plan_indices(self, layout: BatchLayout) -> IndexPlan:
        return self.model.plan_indices(layout)

    def compute_logits(self, inp: ForwardInput) -> Tensor:
        """``[num_logits, vocab]`` float32 logits at ``inp.logits_indices``."""
        return self._head(self.model.forward(inp), (self.lm_head,)).float()

    def allocate_slots(self, num_slots: int) -> None:
        self.model.allocate_slots(num_slots)

    def reset_slot(self, slot: int) -> None:
        self.model.reset_slot(slot)
