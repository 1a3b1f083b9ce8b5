"""A runner's structure, as vLLM's GPU model runner has it: the entry stages the step's ids into
buffers another object holds (a ``CpuGpuBuffer``-like holder), and the model's own methods read
them; a method re-checks the guard its caller already took.

A method sees the objects as the caller left them (what was staged, and where it was not), a
``copy_`` hands back the tensor it filled, and a side of a guard a caller without device ids
never takes is not a path.
"""

import torch
from torch import Tensor

from czoo.servable import ServableLM
from czoo.views import StagingBuffer
from tokenstate.contracts import ForwardInput, entry_point


class RunnerLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.input_ids = StagingBuffer(4096)
        self.token_ids = torch.zeros(4096, dtype=torch.long)  # [4096]: a persistent table

    def run(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.input_ids.gpu[: inp.num_tokens]), inp)

    def stage(self, inp: ForwardInput) -> None:
        n = inp.num_tokens
        if inp.device_tokens is None:
            self.token_ids[:n].copy_(inp.host_tokens.ids)
            return  # what it wrote on the way out is the caller's
        if not inp.has_stale_rows:
            self.token_ids[:n].copy_(inp.host_tokens.ids)
        else:
            self.token_ids[:n].copy_(inp.device_tokens.ids)

    def update_states(self, inp: ForwardInput) -> None:
        if inp.device_tokens is None:  # the caller's guard, checked again
            self.token_ids[: inp.num_tokens].copy_(inp.host_tokens.ids)


def build_runner(config: dict, *, device: torch.device, seed: int) -> RunnerLM:
    return RunnerLM(config).to(device)


@entry_point
def a_method_reads_what_the_entry_staged_on_fresh_steps(model: RunnerLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.gpu[:n].copy_(inp.host_tokens.ids)
    return model.run(inp)


@entry_point
def a_method_reads_what_the_entry_staged_on_every_path(model: RunnerLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.gpu[:n].copy_(inp.host_tokens.ids)
    else:
        model.input_ids.gpu[:n].copy_(inp.device_tokens.ids)
    return model.run(inp)


@entry_point
def the_copy_a_method_returns_staged_on_fresh_steps(model: RunnerLM, inp: ForwardInput) -> Tensor:
    n = inp.num_tokens
    if not inp.has_stale_rows:
        model.input_ids.np[:n] = inp.host_tokens.ids.numpy()
    ids = model.input_ids.copy_to_gpu(n)
    return model.logits(model.embed(ids), inp)


@entry_point
def a_method_rechecks_the_guard_its_caller_took(model: RunnerLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is None:
        model.update_states(inp)
        ids = model.token_ids[: inp.num_tokens]
    else:
        ids = inp.device_tokens.ids
    return model.logits(model.embed(ids), inp)


@entry_point
def a_staging_method_called_on_both_sides_of_a_guard(model: RunnerLM, inp: ForwardInput) -> Tensor:
    if inp.device_tokens is not None:
        model.stage(inp)
    else:
        model.stage(inp)  # here only its early-return side runs
    return model.logits(model.embed(model.token_ids[: inp.num_tokens]), inp)
