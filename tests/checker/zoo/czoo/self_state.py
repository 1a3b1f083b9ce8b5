"""State on `self`: one method assigns an attribute that a later method reads."""

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class StagedLM(ServableLM):
    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.step_ids: Tensor | None = None

    def prepare(self, inp: ForwardInput) -> None:
        self.step_ids = inp.embedding_ids()

    def prepare_from_host(self, inp: ForwardInput) -> None:
        self.step_ids = inp.host_tokens.placeholder_buffer().clamp(min=0)

    def run(self, inp: ForwardInput) -> Tensor:
        return self.logits(self.embed(self.step_ids), inp)

    def forward(self, inp: ForwardInput) -> Tensor:
        self.prepare(inp)
        return self.run(inp)


@entry_point
def staged_by_caller(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.prepare(inp)
    return model.run(inp)


@entry_point
def staged_by_caller_host(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.prepare_from_host(inp)
    return model.run(inp)


@entry_point
def staged_by_own_forward(model: StagedLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def staged_by_assignment_host(model: StagedLM, inp: ForwardInput) -> Tensor:
    model.step_ids = inp.host_tokens.row_ids(0) if inp.num_rows == 1 else inp.host_tokens.ids
    return model.run(inp)
