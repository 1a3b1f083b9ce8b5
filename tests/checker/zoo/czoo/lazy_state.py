"""Buffers a model creates lazily, on its first forward call, and fills in place on later calls:
``if not hasattr(self, "staged"): self.register_buffer("staged", ...)`` or ``if self.staged is
None: self.staged = torch.zeros(...)``.

Only the first call creates the buffer; every later call finds what earlier calls left in it. Host
ids staged there on fresh steps only and embedded on every step hand a stale step an earlier step's
ids.
"""

import torch
from torch import Tensor

from czoo.persistent import fit
from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point

MAX_TOKENS = 4096


class LazilyRegisteredLM(ServableLM):
    """Registers its staging buffer on the first call; stages host ids on fresh steps only."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not hasattr(self, "staged"):
            self.register_buffer("staged", torch.zeros(MAX_TOKENS, dtype=torch.long), persistent=False)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class AllocatedWhenNoneLM(ServableLM):
    """Declares the buffer ``None`` and allocates it on the first call."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.staged: Tensor | None = None

    def forward(self, inp: ForwardInput) -> Tensor:
        if self.staged is None:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n] = inp.host_tokens.ids
        return self.logits(self.embed(self.staged[:n]), inp)


class GrownWhenTooSmallLM(AllocatedWhenNoneLM):
    """Allocates the buffer when missing or too small for the step."""

    def forward(self, inp: ForwardInput) -> Tensor:
        n = inp.num_tokens
        if self.staged is None or self.staged.shape[0] < n:
            self.staged = torch.zeros(max(n, MAX_TOKENS), dtype=torch.long)
        if not inp.has_stale_rows:
            self.staged[:n] = inp.host_tokens.ids
        return self.logits(self.embed(self.staged[:n]), inp)


def build_grown_when_too_small(config: dict, *, device: torch.device, seed: int) -> GrownWhenTooSmallLM:
    return GrownWhenTooSmallLM(config).to(device)


@entry_point
def a_buffer_allocated_when_none_or_too_small_filled_on_fresh_steps(model: GrownWhenTooSmallLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class FoundByGetattrLM(ServableLM):
    """Looks the buffer up with a default, allocating it when missing."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if getattr(self, "staged", None) is None:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class StagedOnEveryPathLM(ServableLM):
    """The same lazy buffer, given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not hasattr(self, "staged"):
            self.register_buffer("staged", torch.zeros(MAX_TOKENS, dtype=torch.long), persistent=False)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        else:
            self.staged[:n].copy_(inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class EnsuredByAHelperLM(ServableLM):
    """Creates the buffer in a helper method the forward calls first."""

    def _ensure_staged(self) -> None:
        if not hasattr(self, "staged"):
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)

    def forward(self, inp: ForwardInput) -> Tensor:
        self._ensure_staged()
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_ensured_by_a_helper(config: dict, *, device: torch.device, seed: int) -> EnsuredByAHelperLM:
    return EnsuredByAHelperLM(config).to(device)


@entry_point
def a_buffer_a_helper_creates_filled_on_fresh_steps(model: EnsuredByAHelperLM, inp: ForwardInput) -> Tensor:
    return model(inp)


def build_lazily_registered(config: dict, *, device: torch.device, seed: int) -> LazilyRegisteredLM:
    return LazilyRegisteredLM(config).to(device)


def build_allocated_when_none(config: dict, *, device: torch.device, seed: int) -> AllocatedWhenNoneLM:
    return AllocatedWhenNoneLM(config).to(device)


def build_found_by_getattr(config: dict, *, device: torch.device, seed: int) -> FoundByGetattrLM:
    return FoundByGetattrLM(config).to(device)


def build_staged_on_every_path(config: dict, *, device: torch.device, seed: int) -> StagedOnEveryPathLM:
    return StagedOnEveryPathLM(config).to(device)


@entry_point
def a_lazily_registered_buffer_filled_on_fresh_steps(model: LazilyRegisteredLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_allocated_when_none_filled_on_fresh_steps(model: AllocatedWhenNoneLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_found_by_getattr_filled_on_fresh_steps(model: FoundByGetattrLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_lazily_registered_buffer_filled_on_every_path(model: StagedOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class PreviousIdsLM(ServableLM):
    """Embeds the ids the previous call kept, then keeps this step's host ids on fresh steps only."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.last = torch.zeros(1, dtype=torch.long)  # [1]: until the first fresh step writes it

    def forward(self, inp: ForwardInput) -> Tensor:
        out = self.logits(self.embed(fit(self.last, inp.num_tokens)), inp)
        if not inp.has_stale_rows:
            self.last = inp.host_tokens.ids
        return out


class PreviousIdsOnEveryPathLM(PreviousIdsLM):
    """The same feature, kept on every step: device ids where the host's are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        out = self.logits(self.embed(fit(self.last, inp.num_tokens)), inp)
        self.last = inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids
        return out


def build_previous_ids(config: dict, *, device: torch.device, seed: int) -> PreviousIdsLM:
    return PreviousIdsLM(config).to(device)


def build_previous_ids_on_every_path(config: dict, *, device: torch.device, seed: int) -> PreviousIdsOnEveryPathLM:
    return PreviousIdsOnEveryPathLM(config).to(device)


@entry_point
def ids_kept_on_fresh_steps_read_before_the_write(model: PreviousIdsLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def ids_kept_on_every_path_read_before_the_write(model: PreviousIdsOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class ReadyFlagLM(ServableLM):
    """Allocates its buffer once, behind a flag it sets in the same block."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not getattr(self, "_ready", False):
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class InitialisedFlagLM(ServableLM):
    """Declares ``initialised = False`` in ``__init__`` and allocates its buffer on the first call."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.initialised = False

    def forward(self, inp: ForwardInput) -> Tensor:
        if not self.initialised:
            self.initialised = True
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n] = inp.host_tokens.ids
        return self.logits(self.embed(self.staged[:n]), inp)


class ReadyFlagOnEveryPathLM(ReadyFlagLM):
    """The same flag-guarded buffer, given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not getattr(self, "_ready", False):
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True
        n = inp.num_tokens
        self.staged[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_ready_flag(config: dict, *, device: torch.device, seed: int) -> ReadyFlagLM:
    return ReadyFlagLM(config).to(device)


def build_initialised_flag(config: dict, *, device: torch.device, seed: int) -> InitialisedFlagLM:
    return InitialisedFlagLM(config).to(device)


def build_ready_flag_on_every_path(config: dict, *, device: torch.device, seed: int) -> ReadyFlagOnEveryPathLM:
    return ReadyFlagOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_created_behind_a_ready_flag_filled_on_fresh_steps(model: ReadyFlagLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_behind_an_init_flag_filled_on_fresh_steps(model: InitialisedFlagLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_behind_a_ready_flag_filled_on_every_path(model: ReadyFlagOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class PreviousIdsCreatedWhenNoneLM(ServableLM):
    """The previous-token feature with its buffer created on the first call (``if self.last is None``)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.last: Tensor | None = None

    def forward(self, inp: ForwardInput) -> Tensor:
        if self.last is None:
            self.last = torch.zeros(1, dtype=torch.long)
        out = self.logits(self.embed(fit(self.last, inp.num_tokens)), inp)
        if not inp.has_stale_rows:
            self.last = inp.host_tokens.ids
        return out


def build_previous_ids_created_when_none(config: dict, *, device: torch.device, seed: int) -> PreviousIdsCreatedWhenNoneLM:
    return PreviousIdsCreatedWhenNoneLM(config).to(device)


@entry_point
def ids_kept_in_a_lazily_created_buffer_read_before_the_write(model: PreviousIdsCreatedWhenNoneLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class FirstStepBufferLM(ServableLM):
    """Allocates its buffer on the first step (`if self._step == 0:`, the step counted up after)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self._step = 0

    def forward(self, inp: ForwardInput) -> Tensor:
        if self._step == 0:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self._step += 1
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class FirstStepBufferOnEveryPathLM(FirstStepBufferLM):
    """The same first-step buffer, given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not self._step:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self._step += 1
        n = inp.num_tokens
        self.staged[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_first_step_buffer(config: dict, *, device: torch.device, seed: int) -> FirstStepBufferLM:
    return FirstStepBufferLM(config).to(device)


def build_first_step_buffer_on_every_path(config: dict, *, device: torch.device, seed: int) -> FirstStepBufferOnEveryPathLM:
    return FirstStepBufferOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_created_on_the_first_step_filled_on_fresh_steps(model: FirstStepBufferLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_on_the_first_step_filled_on_every_path(model: FirstStepBufferOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class RegisteredBehindAFlagLM(ServableLM):
    """Registers its buffer once, behind a flag set in the same block."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self._ready = False

    def forward(self, inp: ForwardInput) -> Tensor:
        if not self._ready:
            self.register_buffer("staged", torch.zeros(MAX_TOKENS, dtype=torch.long), persistent=False)
            self._ready = True
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_registered_behind_a_flag(config: dict, *, device: torch.device, seed: int) -> RegisteredBehindAFlagLM:
    return RegisteredBehindAFlagLM(config).to(device)


@entry_point
def a_buffer_registered_behind_a_ready_flag_filled_on_fresh_steps(model: RegisteredBehindAFlagLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class AllocatedWhenEmptyLM(ServableLM):
    """Starts with an empty buffer and allocates it once, while it is still empty (`numel() == 0`)."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.staged = torch.zeros(0, dtype=torch.long)

    def forward(self, inp: ForwardInput) -> Tensor:
        if self.staged.numel() == 0:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class AllocatedWhenNoLengthLM(AllocatedWhenEmptyLM):
    """The same empty buffer, allocated under `not len(self.staged)`."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not len(self.staged):
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class AllocatedWhenEmptyOnEveryPathLM(AllocatedWhenEmptyLM):
    """The same empty buffer, given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if not self.staged.numel():
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        self.staged[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_allocated_when_empty(config: dict, *, device: torch.device, seed: int) -> AllocatedWhenEmptyLM:
    return AllocatedWhenEmptyLM(config).to(device)


def build_allocated_when_no_length(config: dict, *, device: torch.device, seed: int) -> AllocatedWhenNoLengthLM:
    return AllocatedWhenNoLengthLM(config).to(device)


def build_allocated_when_empty_on_every_path(config: dict, *, device: torch.device, seed: int) -> AllocatedWhenEmptyOnEveryPathLM:
    return AllocatedWhenEmptyOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_allocated_while_empty_filled_on_fresh_steps(model: AllocatedWhenEmptyLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_allocated_while_it_has_no_length_filled_on_fresh_steps(model: AllocatedWhenNoLengthLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_allocated_while_empty_filled_on_every_path(model: AllocatedWhenEmptyOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class FlagSpellingLM(ServableLM):
    """Allocates its buffer once behind a flag (declared False in ``__init__``), spelt as each
    subclass spells the test; stages host ids on fresh steps only."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self._ready = False

    def ensure_staged(self) -> None:
        raise NotImplementedError

    def forward(self, inp: ForwardInput) -> Tensor:
        self.ensure_staged()
        n = inp.num_tokens
        if not inp.has_stale_rows:
            self.staged[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class ReadyIsFalseLM(FlagSpellingLM):
    def ensure_staged(self) -> None:
        if self._ready is False:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True


class ReadyIsNotTrueLM(FlagSpellingLM):
    def ensure_staged(self) -> None:
        if getattr(self, "_ready", None) is not True:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True


class ReadyInTheDictLM(FlagSpellingLM):
    def ensure_staged(self) -> None:
        if not self.__dict__.get("_ready"):
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True


class ReadyAndEnabledLM(FlagSpellingLM):
    enabled = True

    def ensure_staged(self) -> None:
        if not self._ready and self.enabled:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True


class ReadyElseCreateLM(FlagSpellingLM):
    def ensure_staged(self) -> None:
        if self._ready:
            pass
        else:
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True


class ReadyEqualsFalseOnEveryPathLM(FlagSpellingLM):
    """The flag spelt ``== False``; the buffer given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if self._ready == False:  # noqa: E712 (the spelling under test)
            self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
            self._ready = True
        n = inp.num_tokens
        self.staged[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_ready_is_false(config: dict, *, device: torch.device, seed: int) -> ReadyIsFalseLM:
    return ReadyIsFalseLM(config).to(device)


def build_ready_is_not_true(config: dict, *, device: torch.device, seed: int) -> ReadyIsNotTrueLM:
    return ReadyIsNotTrueLM(config).to(device)


def build_ready_in_the_dict(config: dict, *, device: torch.device, seed: int) -> ReadyInTheDictLM:
    return ReadyInTheDictLM(config).to(device)


def build_ready_and_enabled(config: dict, *, device: torch.device, seed: int) -> ReadyAndEnabledLM:
    return ReadyAndEnabledLM(config).to(device)


def build_ready_else_create(config: dict, *, device: torch.device, seed: int) -> ReadyElseCreateLM:
    return ReadyElseCreateLM(config).to(device)


def build_ready_equals_false_on_every_path(config: dict, *, device: torch.device, seed: int) -> ReadyEqualsFalseOnEveryPathLM:
    return ReadyEqualsFalseOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_created_once_behind_a_flag_is_false_filled_on_fresh_steps(model: ReadyIsFalseLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_once_behind_a_flag_is_not_true_filled_on_fresh_steps(model: ReadyIsNotTrueLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_once_behind_a_flag_in_the_dict_filled_on_fresh_steps(model: ReadyInTheDictLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_once_behind_a_flag_and_a_switch_filled_on_fresh_steps(model: ReadyAndEnabledLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_once_in_the_else_of_a_flag_filled_on_fresh_steps(model: ReadyElseCreateLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_created_once_behind_a_flag_equal_to_false_filled_on_every_path(model: ReadyEqualsFalseOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class SetUpByAHelperLM(FlagSpellingLM):
    """Its once-only block calls a helper that allocates the buffer and sets the flag."""

    def ensure_staged(self) -> None:
        if not self._ready:
            self._set_up()

    def _set_up(self) -> None:
        self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self._ready = True


class SetUpInOneAssignmentLM(FlagSpellingLM):
    """Allocates the buffer and sets the flag in one tuple assignment."""

    def ensure_staged(self) -> None:
        if not self._ready:
            self.staged, self._ready = torch.zeros(MAX_TOKENS, dtype=torch.long), True


class ReturnsOnceReadyLM(FlagSpellingLM):
    """``if self._ready: return`` first, the allocation after it: the rest of the helper runs once."""

    def ensure_staged(self) -> None:
        if getattr(self, "_ready", False):
            return
        self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self._ready = True


class ReturnsOnceReadyOnEveryPathLM(ReturnsOnceReadyLM):
    """The same early return, the buffer given device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        self.ensure_staged()
        n = inp.num_tokens
        self.staged[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_set_up_by_a_helper(config: dict, *, device: torch.device, seed: int) -> SetUpByAHelperLM:
    return SetUpByAHelperLM(config).to(device)


def build_set_up_in_one_assignment(config: dict, *, device: torch.device, seed: int) -> SetUpInOneAssignmentLM:
    return SetUpInOneAssignmentLM(config).to(device)


def build_returns_once_ready(config: dict, *, device: torch.device, seed: int) -> ReturnsOnceReadyLM:
    return ReturnsOnceReadyLM(config).to(device)


def build_returns_once_ready_on_every_path(config: dict, *, device: torch.device, seed: int) -> ReturnsOnceReadyOnEveryPathLM:
    return ReturnsOnceReadyOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_a_helper_sets_up_once_behind_a_flag_filled_on_fresh_steps(model: SetUpByAHelperLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_set_up_once_in_one_assignment_filled_on_fresh_steps(model: SetUpInOneAssignmentLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_allocated_after_an_early_return_filled_on_fresh_steps(model: ReturnsOnceReadyLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_allocated_after_an_early_return_filled_on_every_path(model: ReturnsOnceReadyOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class FoundByAWalrusLM(ServableLM):
    """Finds its buffer with a walrus (`(buf := getattr(self, "staged", None)) is None`), creates it
    there once (`buf = self.staged = torch.zeros(...)`) and fills it through `buf` on fresh steps."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if (buf := getattr(self, "staged", None)) is None:
            buf = self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            buf[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


class FoundByAWalrusOnEveryPathLM(ServableLM):
    """The same buffer, filled through `buf` with device ids on the steps whose host ids are stale."""

    def forward(self, inp: ForwardInput) -> Tensor:
        if (buf := getattr(self, "staged", None)) is None:
            buf = self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)
        n = inp.num_tokens
        buf[:n].copy_(inp.host_tokens.ids if not inp.has_stale_rows else inp.device_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_found_by_a_walrus(config: dict, *, device: torch.device, seed: int) -> FoundByAWalrusLM:
    return FoundByAWalrusLM(config).to(device)


def build_found_by_a_walrus_on_every_path(config: dict, *, device: torch.device, seed: int) -> FoundByAWalrusOnEveryPathLM:
    return FoundByAWalrusOnEveryPathLM(config).to(device)


@entry_point
def a_buffer_found_by_a_walrus_filled_through_it_on_fresh_steps(model: FoundByAWalrusLM, inp: ForwardInput) -> Tensor:
    return model(inp)


@entry_point
def a_buffer_found_by_a_walrus_filled_through_it_on_every_path(model: FoundByAWalrusOnEveryPathLM, inp: ForwardInput) -> Tensor:
    return model(inp)


class FilledThroughGetattrLM(ServableLM):
    """Holds a staging buffer from ``__init__``, fetched by name (``getattr(self, "staged")``) and
    filled through the local on fresh steps."""

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.staged = torch.zeros(MAX_TOKENS, dtype=torch.long)

    def forward(self, inp: ForwardInput) -> Tensor:
        buf = getattr(self, "staged")  # noqa: B009 (the spelling under test)
        n = inp.num_tokens
        if not inp.has_stale_rows:
            buf[:n].copy_(inp.host_tokens.ids)
        return self.logits(self.embed(self.staged[:n]), inp)


def build_filled_through_getattr(config: dict, *, device: torch.device, seed: int) -> FilledThroughGetattrLM:
    return FilledThroughGetattrLM(config).to(device)


@entry_point
def a_buffer_fetched_by_getattr_filled_through_it_on_fresh_steps(model: FilledThroughGetattrLM, inp: ForwardInput) -> Tensor:
    return model(inp)

