"""Forwards the routing checker still judges wrongly (RCK-85, owed). A replacement pass undone by
the next is a false alarm, since the checker's passes only *may* replace; a buffer regrown under a
test on a local that names it (``buf = self.staged; if buf.numel() < n: buf = self.staged = ...``)
and filled through the local on fresh steps is a silent ``honors``. Each was run through the engine
too: the first gives the synchronous tokens on the async path, the second diverges from them.
(What probe 47a found beside them is in the zoo now: RCK-89 to RCK-103.)
"""

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


class WithSources(Servable):
    def __init__(self) -> None:
        super().__init__()
        self.source = DeviceIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits_of(self.source(inp), inp)


# -- false alarms: a replacement pass's filter and a pass that undoes another ----------------------


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
def a_pass_undone_by_the_next(model: WithSources, inp: ForwardInput) -> Tensor:
    return model(inp)


class GrownThroughALocal(Servable):
    """Grows its buffer when too small, tested and filled through a local that names it."""

    def __init__(self) -> None:
        super().__init__()
        self.staged = torch.zeros(0, dtype=torch.long)

    def forward(self, inp: ForwardInput) -> Tensor:
        n = inp.num_tokens
        buf = self.staged
        if buf.numel() < n:
            buf = self.staged = torch.zeros(2 * n, dtype=torch.long)
        if not inp.has_stale_rows:
            buf[:n].copy_(inp.host_tokens.ids)
        return self.logits_of(self.staged[:n], inp)


@entry_point
def a_buffer_regrown_through_a_local(model: GrownThroughALocal, inp: ForwardInput) -> Tensor:
    return model(inp)


EXPECTED = {
    "a_pass_undone_by_the_next": ("honors", "build_swapped_and_swapped_back"),
    "a_buffer_regrown_through_a_local": ("ignores", None),
}
"""Each forward's right verdict, and the build function a runner would call (None: the class)."""
