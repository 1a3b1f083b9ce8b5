"""State kept beyond the call under a name spelt at run time: a buffer registered from the forward
(``self.register_buffer("last_ids", ids)``), a module global written through ``globals()`` and an
attribute written through ``obj.__dict__``.

Each is the plain assignment it spells (``self.last_ids = ids``, ``global KEPT; KEPT = ids``): host
ids kept that way on fresh steps and embedded on every step hand a stale step an earlier step's ids.
"""

import functools

import torch
from torch import Tensor

from czoo.persistent import fit
from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_KEPT_IDS = torch.zeros(1, dtype=torch.long)  # [1]: until the first fresh step writes it


class RegisteringLM(ServableLM):
    """Registers the last fresh step's ids as a buffer, from its forward."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.register_buffer("last_ids", torch.zeros(1, dtype=torch.long), persistent=False)

    def forward(self, inp: ForwardInput) -> Tensor:
        if not inp.has_stale_rows:
            self.register_buffer("last_ids", inp.host_tokens.ids.clone(), persistent=False)
        return self.logits(self.embed(fit(self.last_ids, inp.num_tokens)), inp)


def build_registering(config: dict, *, device: torch.device, seed: int) -> RegisteringLM:
    return RegisteringLM(config).to(device)


@entry_point
def a_buffer_registered_on_fresh_steps(model: RegisteringLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def globals_keep_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        globals()["_KEPT_IDS"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(_KEPT_IDS, inp.num_tokens)), inp)


@entry_point
def globals_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        globals()["_KEPT_IDS"] = inp.host_tokens.ids
    else:
        globals()["_KEPT_IDS"] = inp.device_tokens.ids
    return model.logits(model.embed(_KEPT_IDS), inp)


@entry_point
def instance_dict_keeps_host_ids_of_fresh_steps(model: RegisteringLM, inp: ForwardInput) -> Tensor:
    if not inp.has_stale_rows:
        model.__dict__["kept_ids"] = inp.host_tokens.ids
    return model.logits(model.embed(fit(model.kept_ids, inp.num_tokens)), inp)


def make_remembering_forward():
    """A forward built as a closure that keeps the last fresh step's ids in its enclosing scope."""
    kept = torch.zeros(1, dtype=torch.long)  # [1]: until the first fresh step writes it

    def forward(model: ServableLM, inp: ForwardInput) -> Tensor:
        nonlocal kept
        if not inp.has_stale_rows:
            kept = inp.host_tokens.ids
        return model.logits(model.embed(fit(kept, inp.num_tokens)), inp)

    return forward


_remembering_forward = make_remembering_forward()


@entry_point
def a_nonlocal_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    return _remembering_forward(model, inp)


def remember(ids: Tensor | None, _kept: list = []) -> Tensor:  # noqa: B006 - the default is the cache
    """The last ids given, kept in the default argument (one list for every call)."""
    if ids is not None:
        _kept[:] = [ids]
    return _kept[0]


@entry_point
def a_default_argument_keeps_host_ids_of_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    kept = remember(inp.host_tokens.ids if not inp.has_stale_rows else None)
    return model.logits(model.embed(fit(kept, inp.num_tokens)), inp)


@functools.cache
def step_buffer(size: int) -> Tensor:
    return torch.zeros(size, dtype=torch.long)  # [size]: one buffer per size, for every call


@entry_point
def a_cached_buffer_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        step_buffer(4096)[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(step_buffer(4096)[:n]), inp)


def make_staging_forward():
    """The same closure, writing its enclosing variable on every path."""
    kept = torch.zeros(1, dtype=torch.long)  # [1]

    def forward(model: ServableLM, inp: ForwardInput) -> Tensor:
        nonlocal kept
        if not inp.has_stale_rows:
            kept = inp.host_tokens.ids
        else:
            kept = inp.device_tokens.ids
        return model.logits(model.embed(kept), inp)

    return forward


_staging_forward = make_staging_forward()


@entry_point
def a_nonlocal_written_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    return _staging_forward(model, inp)


def keep(ids: Tensor, _kept: list = []) -> Tensor:  # noqa: B006 - the default is the cache
    """The ids given, kept in the default argument on every call."""
    _kept[:] = [ids]
    return _kept[0]


@entry_point
def a_default_argument_given_ids_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    kept = keep(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
    return model.logits(model.embed(kept), inp)


@entry_point
def a_cached_buffer_filled_on_every_path(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        step_buffer(4096)[:n].copy_(inp.host_tokens.ids)
    else:
        step_buffer(4096)[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(step_buffer(4096)[:n]), inp)


def make_buffer_forward():
    """A forward built as a closure over one tensor, which it fills in place on fresh steps."""
    buf = torch.zeros(4096, dtype=torch.long)  # [4096]: one tensor for every call

    def forward(model: ServableLM, inp: ForwardInput) -> Tensor:
        n = inp.num_tokens
        if not inp.has_stale_rows:
            buf[:n].copy_(inp.host_tokens.ids)
        return model.logits(model.embed(buf[:n]), inp)

    return forward


_buffer_forward = make_buffer_forward()


@entry_point
def a_captured_buffer_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    return _buffer_forward(model, inp)


def stage(ids: Tensor | None, n: int, _buf: Tensor = torch.zeros(4096, dtype=torch.long)) -> Tensor:  # noqa: B008 - one tensor
    """Ids staged in the default tensor (one object for every call), which is handed back."""
    if ids is not None:
        _buf[:n].copy_(ids)
    return _buf[:n]


@entry_point
def a_default_tensor_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    ids = stage(inp.host_tokens.ids if not inp.has_stale_rows else None, inp.num_tokens)
    return model.logits(model.embed(ids), inp)


_STAGE = torch.zeros(4096, dtype=torch.long)  # [4096]


@entry_point
def a_global_filled_through_globals_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        globals()["_STAGE"][:n] = inp.host_tokens.ids
    return model.logits(model.embed(_STAGE[:n]), inp)


class ReRegisteringLM(ServableLM):
    """Registers its embedding submodule again under the same name, as a wrapper that reads host ids."""

    def __init__(self, config: dict | None = None, *, table: str = "add_module") -> None:
        super().__init__(config)
        self.ids_source = DeviceIdsSource()
        if table == "add_module":
            self.add_module("ids_source", HostIdsSource())
        else:
            self._modules["ids_source"] = HostIdsSource()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


class DeviceIdsSource(torch.nn.Module):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostIdsSource(DeviceIdsSource):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class KeptDeviceSourceLM(ReRegisteringLM):
    """Re-registers the device-id source itself: nothing changes."""

    def __init__(self, config: dict | None = None) -> None:
        ServableLM.__init__(self, config)
        self.ids_source = HostIdsSource()
        self.add_module("ids_source", DeviceIdsSource())


def build_re_registering(config: dict, *, device: torch.device, seed: int) -> ReRegisteringLM:
    return ReRegisteringLM(config).to(device)


def build_modules_table(config: dict, *, device: torch.device, seed: int) -> ReRegisteringLM:
    return ReRegisteringLM(config, table="_modules").to(device)


def build_kept_device_source(config: dict, *, device: torch.device, seed: int) -> KeptDeviceSourceLM:
    return KeptDeviceSourceLM(config).to(device)


@entry_point
def a_submodule_re_registered_by_add_module(model: ReRegisteringLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_submodule_replaced_in_the_modules_table(model: ReRegisteringLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_submodule_re_registered_with_device_ids(model: KeptDeviceSourceLM, inp: ForwardInput) -> Tensor:
    return model(inp)
