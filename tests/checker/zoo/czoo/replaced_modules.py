"""Submodules replaced after construction by a module-replacement pass, as LoRA and quantisation
libraries replace them: ``model.apply(fn)`` where ``fn`` walks ``named_children()`` and
``setattr``s a wrapper under each child's (computed) name.

The wrapper is what the forward calls: one that reads host ids is a finding, though the module
``__init__`` built read device ids.
"""

import torch
from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class DeviceIds(nn.Module):
    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostIds(DeviceIds):
    """The replacement: reads the host buffer."""

    def forward(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class WithIdsSource(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = DeviceIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def swap_to_host_ids(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, DeviceIds):
            setattr(module, name, HostIds())


def swap_to_device_ids(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, DeviceIds):
            setattr(module, name, DeviceIds())


class LoRALinear(nn.Module):
    """A low-rank adapter around a linear layer (what LoRA injection puts in place of each)."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x)


def inject_lora(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, LoRALinear(child))


def build_with_lora(config: dict, *, device: torch.device, seed: int) -> WithIdsSource:
    model = WithIdsSource(config)
    model.apply(inject_lora)
    return model.to(device)


def build_swapped_to_host(config: dict, *, device: torch.device, seed: int) -> WithIdsSource:
    model = WithIdsSource(config)
    model.apply(swap_to_host_ids)
    return model.to(device)


def build_swapped_to_device(config: dict, *, device: torch.device, seed: int) -> WithIdsSource:
    model = WithIdsSource(config)
    model.apply(swap_to_device_ids)
    return model.to(device)


@entry_point
def submodules_swapped_to_host_ids_by_apply(model: WithIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def submodules_swapped_to_device_ids_by_apply(model: WithIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def lora_adapters_injected_by_apply(model: WithIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


class StackedIdsSource(nn.Module):
    """Holds the ids source one level down, as a decoder holds its layers' submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.source = DeviceIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.source(inp)


class WithNestedIdsSource(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.stack = StackedIdsSource()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.stack(inp)), inp)


def build_swapped_over_named_modules(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if isinstance(child, DeviceIds):
                setattr(module, name, HostIds())
    return model.to(device)


def build_swapped_over_modules(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for module in list(model.modules()):
        swap_to_host_ids(module)
    return model.to(device)


def build_device_swapped_over_named_modules(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for _, module in model.named_modules():
        swap_to_device_ids(module)
    return model.to(device)


@entry_point
def nested_submodules_swapped_to_host_ids_over_named_modules(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def nested_submodules_swapped_to_host_ids_over_modules(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def nested_submodules_swapped_to_device_ids_over_named_modules(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_replaced_by_name_over_named_modules(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for name, module in model.named_modules():
        if name.endswith("stack"):
            module.source = HostIds()
    return model.to(device)


@entry_point
def nested_submodule_replaced_by_name_over_named_modules(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_set_submodule_to_host(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    model.set_submodule("stack.source", HostIds())
    return model.to(device)


def build_set_submodule_to_device(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    model.set_submodule("stack.source", DeviceIds())
    return model.to(device)


def build_get_submodule_then_setattr(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    model.get_submodule("stack").source = HostIds()
    return model.to(device)


@entry_point
def a_source_set_to_host_ids_by_its_path(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_source_set_to_device_ids_by_its_path(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_source_replaced_on_a_submodule_got_by_its_path(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_replaced_through_the_module_table(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if type(child) is DeviceIds:
                module._modules[name] = HostIds()  # nn.Module's own table, under the child's name
    return model.to(device)


def build_device_through_the_module_table(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if type(child) is DeviceIds:
                module._modules[name] = DeviceIds()
    return model.to(device)


@entry_point
def a_source_replaced_to_host_ids_through_the_module_table(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_source_replaced_to_device_ids_through_the_module_table(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


class UnusedIds(DeviceIds):
    """A sibling of the ids source, held but never called."""


class WithAnUnusedSibling(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = DeviceIds()
        self.spare = UnusedIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def build_filtered_to_the_unused_sibling(config: dict, *, device: torch.device, seed: int) -> WithAnUnusedSibling:
    model = WithAnUnusedSibling(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if isinstance(child, UnusedIds):  # the pass's own filter: only the spare is replaced
                setattr(module, name, HostIds())
    return model.to(device)


def build_filtered_to_the_used_source(config: dict, *, device: torch.device, seed: int) -> WithAnUnusedSibling:
    model = WithAnUnusedSibling(config)
    for module in model.modules():
        for name, child in module.named_children():
            if not isinstance(child, UnusedIds):
                module._modules[name] = HostIds()
    return model.to(device)


@entry_point
def a_pass_filtered_to_an_unused_sibling(model: WithAnUnusedSibling, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_pass_filtered_to_the_used_source(model: WithAnUnusedSibling, inp: ForwardInput) -> Tensor:
    return model(inp)


class WithASubclassedSource(ServableLM):
    """Its ids source is a subclass of the spare's class: an exact-type filter tells them apart."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = UnusedIds()  # (a DeviceIds subclass) the one the forward calls
        self.spare = DeviceIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def build_exact_type_to_the_spare(config: dict, *, device: torch.device, seed: int) -> WithASubclassedSource:
    model = WithASubclassedSource(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if type(child) is DeviceIds:  # not the subclass the forward calls
                setattr(module, name, HostIds())
    return model.to(device)


def build_exact_type_to_the_source(config: dict, *, device: torch.device, seed: int) -> WithASubclassedSource:
    model = WithASubclassedSource(config)
    for _, module in model.named_modules():
        for name, child in list(module.named_children()):
            if type(child) == UnusedIds:  # noqa: E721 (the spelling under test)
                setattr(module, name, HostIds())
    return model.to(device)


@entry_point
def a_pass_filtered_by_exact_type_to_the_spare(model: WithASubclassedSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_pass_filtered_by_exact_type_to_the_source(model: WithASubclassedSource, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_replaced_by_add_module(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for module in model.modules():
        for name, child in list(module.named_children()):
            if isinstance(child, DeviceIds):
                module.add_module(name, HostIds())  # nn.Module's own setter, under the child's name
    return model.to(device)


@entry_point
def a_source_replaced_to_host_ids_by_add_module(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


class WithAHostSource(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.ids_source = HostIds()

    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.ids_source(inp)), inp)


def build_forward_rebound_to_host_ids(config: dict, *, device: torch.device, seed: int) -> WithNestedIdsSource:
    model = WithNestedIdsSource(config)
    for module in model.modules():
        if isinstance(module, DeviceIds):
            module.forward = lambda inp: inp.host_tokens.ids  # the instance's own forward
    return model.to(device)


def build_forward_rebound_to_device_ids(config: dict, *, device: torch.device, seed: int) -> WithAHostSource:
    model = WithAHostSource(config)
    model.ids_source.forward = lambda inp: inp.embedding_ids()
    return model.to(device)


@entry_point
def a_source_whose_forward_is_rebound_to_read_host_ids(model: WithNestedIdsSource, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_source_whose_forward_is_rebound_to_read_device_ids(model: WithAHostSource, inp: ForwardInput) -> Tensor:
    return model(inp)
