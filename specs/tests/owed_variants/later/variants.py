"""Forwards the routing checker still judges wrongly (RCK-85, owed). The replacement-pass false
alarms: it does not apply a pass's own filter, nor let a later pass undo an earlier one. The misses:
a patch applied by a function called at import, a submodule replaced through ``module._modules``
with a computed name, a once-only block behind ``numel() == 0``, and a NamedTuple read through
``dict(zip(meta._fields, meta))``. Each was run through the engine too: the false alarms give the
synchronous tokens on the async path, the misses raise StaleHostTokensError or diverge there.
"""

from typing import NamedTuple

import torch
from torch import Tensor, nn

from tokenstate.contracts import ForwardInput, entry_point
from tokenstate.runtime.kernels import guarded_embedding

VOCAB, HIDDEN = 40, 8


class Servable(nn.Module):
    """Stateless and batch invariant: a position's logits depend only on the id embedded there."""

    vocab_size = VOCAB
    max_model_len = 64
    eos_token_id = None

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(13)
        self.weight = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen), requires_grad=False)  # [vocab, hidden]
        self.head = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen), requires_grad=False)  # [vocab, hidden]

    def allocate_slots(self, num_slots: int) -> None:
        """Stateless: nothing per slot."""

    def reset_slot(self, slot: int) -> None:
        """Stateless: nothing per slot."""

    def logits_of(self, ids: Tensor, inp: ForwardInput) -> Tensor:
        rows = guarded_embedding(ids, self.weight).index_select(0, inp.logits_indices)  # [num_logits, hidden]
        return (rows.unsqueeze(1) * self.head).sum(dim=2)  # [num_logits, vocab]


class DeviceIds(nn.Module):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostIds(DeviceIds):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class OtherIds(DeviceIds):
    """A sibling of the used source, held but never called."""


class WithSources(Servable):
    def __init__(self) -> None:
        super().__init__()
        self.source = DeviceIds()
        self.unused = OtherIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits_of(self.source(inp), inp)


# -- false alarms: a replacement pass's filter and a pass that undoes another ----------------------


def build_filtered_to_the_unused_sibling(config: dict, *, device: torch.device, seed: int) -> WithSources:
    model = WithSources()
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if isinstance(child, OtherIds):  # only the unused sibling is replaced
                setattr(module, name, HostIds())
    return model.to(device)


def build_swapped_and_swapped_back(config: dict, *, device: torch.device, seed: int) -> WithSources:
    model = WithSources()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is DeviceIds:
                setattr(module, name, HostIds())
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, HostIds):
                setattr(module, name, DeviceIds())
    return model.to(device)


@entry_point
def a_pass_filtered_to_an_unused_sibling(model: WithSources, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_pass_undone_by_the_next(model: WithSources, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_replaced_through_the_module_table(config: dict, *, device: torch.device, seed: int) -> WithSources:
    model = WithSources()
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if type(child) is DeviceIds:
                module._modules[name] = HostIds()
    return model.to(device)


@entry_point
def a_source_replaced_through_the_module_table(model: WithSources, inp: ForwardInput) -> Tensor:
    return model(inp)


class PatchedAtImport(Servable):
    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


def _host_ids_for(self: Servable, inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


def apply_patches() -> None:
    PatchedAtImport.ids_for = _host_ids_for


apply_patches()


@entry_point
def a_patch_applied_by_a_function_called_at_import(model: PatchedAtImport, inp: ForwardInput) -> Tensor:
    return model.logits_of(model.ids_for(inp), inp)


class AllocatedWhenEmpty(Servable):
    """Allocates its buffer once, when it is still empty (`numel() == 0`); fills it on fresh steps only."""

    def __init__(self) -> None:
        super().__init__()
        self.staged = torch.zeros(0, dtype=torch.long)

    def forward(self, inp: ForwardInput) -> Tensor:
        if self.staged.numel() == 0:
            self.staged = torch.zeros(4096, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits_of(self.staged[:n], inp)


@entry_point
def a_buffer_allocated_when_empty(model: AllocatedWhenEmpty, inp: ForwardInput) -> Tensor:
    return model(inp)


class Meta(NamedTuple):
    positions: Tensor
    tokens: object


@entry_point
def a_named_tuple_zipped_with_its_field_names(model: WithSources, inp: ForwardInput) -> Tensor:
    meta = Meta(inp.positions, inp.host_tokens)
    return model.logits_of(dict(zip(meta._fields, meta, strict=True))["tokens"].ids, inp)


EXPECTED = {
    "a_pass_filtered_to_an_unused_sibling": ("honors", "build_filtered_to_the_unused_sibling"),
    "a_pass_undone_by_the_next": ("honors", "build_swapped_and_swapped_back"),
    "a_source_replaced_through_the_module_table": ("ignores", "build_replaced_through_the_module_table"),
    "a_patch_applied_by_a_function_called_at_import": ("ignores", None),
    "a_buffer_allocated_when_empty": ("ignores", None),
    "a_named_tuple_zipped_with_its_field_names": ("ignores", None),
}
"""Each forward's right verdict, and the build function a runner would call (None: the class)."""
