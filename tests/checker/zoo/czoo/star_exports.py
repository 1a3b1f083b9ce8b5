"""Models imported from the top of a package that re-exports them through nested star imports."""

from torch import Tensor

from czoo.stars import DeepDeviceLM, DeepHostLM
from tokenstate.contracts import ForwardInput, entry_point


@entry_point
def model_from_nested_star_exports_device(model: DeepDeviceLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def model_from_nested_star_exports_host(model: DeepHostLM, inp: ForwardInput) -> Tensor:
    return model(inp)
