"""Entry points that hand their arguments on untouched, as generic wrappers do:
``def forward(model, *args): return model(*args)``. The runtime calls every forward as
``forward(model, inp)``, so ``args`` holds the input."""

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class DeviceLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.embedding_ids()), inp)


class HostLM(ServableLM):
    def forward(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(inp.host_tokens.ids), inp)


@entry_point
def star_args_to_device_model(model: DeviceLM, *args) -> Tensor:
    return model(*args)


@entry_point
def star_args_to_host_model(model: HostLM, *args) -> Tensor:
    return model(*args)


@entry_point
def star_args_and_kwargs_to_host_model(model: HostLM, *args, **kwargs) -> Tensor:
    return model(*args, **kwargs)
