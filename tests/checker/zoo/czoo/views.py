"""Step buffers filled through another view of their memory: vLLM's ``CpuGpuBuffer`` keeps
``.np = .cpu.numpy()`` beside its tensor, the engine fills the numpy array and the model embeds the
tensor (or the device copy made of it).

Ids written through a view are in every view of the same memory and in what it is copied into. A
path that fills the buffer on fresh steps only embeds, on a stale step, what an earlier fresh step
left there (fluent wrong tokens, no error).
"""

import numpy as np
import torch
from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

_INPUT_IDS = torch.zeros(4096, dtype=torch.long)  # [max_tokens]
_INPUT_IDS_NP = _INPUT_IDS.numpy()  # [max_tokens]: the same memory


@entry_point
def module_numpy_view_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        _INPUT_IDS_NP[:n] = inp.host_tokens.ids.numpy()
    return model.logits(model.embed(_INPUT_IDS[:n]), inp)


class NumpyStagedLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.input_ids = torch.zeros(4096, dtype=torch.long)  # [max_tokens]
        self.input_ids_np = self.input_ids.numpy()  # [max_tokens]: the same memory


def build_numpy_staged(config: dict, *, device: torch.device, seed: int) -> NumpyStagedLM:
    return NumpyStagedLM(config).to(device)


@entry_point
def numpy_view_filled_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids_np[:n] = inp.host_tokens.ids.numpy()
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def numpy_view_filled_on_every_path(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids_np[:n] = inp.host_tokens.ids.numpy()
    else:
        model.input_ids[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def tensor_filled_on_fresh_steps_read_through_its_numpy_view(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids[:n].copy_(inp.host_tokens.ids)
    return model.logits(model.embed(torch.from_numpy(model.input_ids_np[:n])), inp)


@entry_point
def local_numpy_view_filled_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    staged = np.asarray(model.input_ids)  # the same memory, under a local name
    if not inp.has_stale_rows:
        staged[:n] = inp.host_tokens.ids.numpy()
    return model.logits(model.embed(model.input_ids[:n]), inp)


class StagingBuffer:
    """vLLM's ``CpuGpuBuffer``: a host tensor, a numpy view of it, and the device tensor it is
    copied into."""

    def __init__(self, size: int) -> None:
        self.cpu = torch.zeros(size, dtype=torch.long)  # [size]
        self.np = self.cpu.numpy()  # [size]: the same memory
        self.gpu = torch.zeros(size, dtype=torch.long)  # [size]

    def copy_to_gpu(self, n: int) -> Tensor:
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


class BufferedLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.input_ids = StagingBuffer(4096)


def build_buffered(config: dict, *, device: torch.device, seed: int) -> BufferedLM:
    return BufferedLM(config).to(device)


@entry_point
def staging_buffer_filled_on_fresh_steps(model: BufferedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.np[:n] = inp.host_tokens.ids.numpy()
        model.input_ids.copy_to_gpu(n)
    return model.logits(model.embed(model.input_ids.gpu[:n]), inp)


@entry_point
def staging_buffer_filled_on_every_path(model: BufferedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.np[:n] = inp.host_tokens.ids.numpy()
        model.input_ids.copy_to_gpu(n)
    else:
        model.input_ids.gpu[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(model.input_ids.gpu[:n]), inp)


class NestedViewLM(ServableLM):
    """A numpy view of a buffer another object holds: ``self.input_ids_np = self.input_ids.cpu.numpy()``."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.input_ids = StagingBuffer(4096)
        self.input_ids_np = self.input_ids.cpu.numpy()  # [4096]: the memory of input_ids.cpu


def build_nested_view(config: dict, *, device: torch.device, seed: int) -> NestedViewLM:
    return NestedViewLM(config).to(device)


@entry_point
def numpy_view_of_a_nested_buffer_filled_on_fresh_steps(model: NestedViewLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids_np[:n] = inp.host_tokens.ids.numpy()
    return model.logits(model.embed(model.input_ids.cpu[:n]), inp)


@entry_point
def ravel_view_filled_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids_np.ravel()[:n] = inp.host_tokens.ids.numpy()
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def np_copyto_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        np.copyto(model.input_ids_np[:n], inp.host_tokens.ids.numpy())
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def np_put_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        np.put(model.input_ids_np, np.arange(n), inp.host_tokens.ids.numpy())
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def np_copyto_on_every_path(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        np.copyto(model.input_ids_np[:n], inp.host_tokens.ids.numpy())
    else:
        model.input_ids[:n].copy_(inp.device_tokens.ids)
    return model.logits(model.embed(model.input_ids[:n]), inp)


@entry_point
def data_view_filled_on_fresh_steps(model: NumpyStagedLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.data[:n] = inp.host_tokens.ids
    return model.logits(model.embed(model.input_ids[:n]), inp)


_STAGED = _EMBEDDED = torch.zeros(4096, dtype=torch.long)  # [max_tokens]: one tensor, two names


@entry_point
def a_chained_name_filled_on_fresh_steps(model: ServableLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        _STAGED[:n] = inp.host_tokens.ids
    return model.logits(model.embed(_EMBEDDED[:n]), inp)
