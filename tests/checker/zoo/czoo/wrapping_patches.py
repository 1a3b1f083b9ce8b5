"""Methods patched at module level the way monkey-patching libraries write it: a patch that keeps
the member it replaces and calls it (``_original = Model.ids_for; Model.ids_for = wrapping``, or
``Model.ids_for = logged(Model.ids_for)``), and patches made in a loop over classes (``for cls in
(A, B): cls.ids_for = ...``, also over a module-level tuple).

The member a patch keeps is the one the class had when the patching statement ran, not the patch
itself; a loop patches every class it names.
"""

from collections.abc import Callable

from torch import Tensor

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class HostOriginalLM(ServableLM):
    """Its own ``ids_for`` reads host ids; a wrapper replacing it calls it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class DeviceOriginalLM(ServableLM):
    """Its own ``ids_for`` reads device ids; a wrapper replacing it calls it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class LoggedHostOriginalLM(HostOriginalLM):
    """Inherits the host-reading ``ids_for``; a decorator-style patch wraps it in place."""


class LoggedDeviceOriginalLM(DeviceOriginalLM):
    """Inherits the device-reading ``ids_for``; a decorator-style patch wraps it in place."""


_host_original = HostOriginalLM.ids_for
_device_original = DeviceOriginalLM.ids_for


def _wrapping_host(self: HostOriginalLM, inp: ForwardInput) -> Tensor:
    return _host_original(self, inp)


def _wrapping_device(self: DeviceOriginalLM, inp: ForwardInput) -> Tensor:
    return _device_original(self, inp)


def logged(method: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def wrapper(self: ServableLM, inp: ForwardInput) -> Tensor:
        return method(self, inp)
    return wrapper


HostOriginalLM.ids_for = _wrapping_host
DeviceOriginalLM.ids_for = _wrapping_device
LoggedHostOriginalLM.ids_for = logged(LoggedHostOriginalLM.ids_for)
LoggedDeviceOriginalLM.ids_for = logged(LoggedDeviceOriginalLM.ids_for)


@entry_point
def a_patch_calling_the_host_reading_member_it_replaced(model: HostOriginalLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_patch_calling_the_device_reading_member_it_replaced(model: DeviceOriginalLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_patch_wrapping_the_host_reading_member_it_replaces_in_place(model: LoggedHostOriginalLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_patch_wrapping_the_device_reading_member_it_replaces_in_place(model: LoggedDeviceOriginalLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class LoopPatchedToHostLM(ServableLM):
    """Its body reads device ids; a loop over classes patches it to read host ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class ListedPatchedToHostLM(ServableLM):
    """Its body reads device ids; a loop over a module-level tuple of classes patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class LoopPatchedToDeviceLM(ServableLM):
    """Its body reads host ids; a loop over (class, method) pairs patches it to read device ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


def _host_ids_for(self: ServableLM, inp: ForwardInput) -> Tensor:
    return inp.host_tokens.ids


def _device_ids_for(self: ServableLM, inp: ForwardInput) -> Tensor:
    return inp.embedding_ids()


for _cls in (LoopPatchedToHostLM,):
    _cls.ids_for = _host_ids_for

PATCHED = (ListedPatchedToHostLM,)
for _cls in PATCHED:
    setattr(_cls, "ids_for", _host_ids_for)  # noqa: B010 (the spelling under test)

for _cls, _method in ((LoopPatchedToDeviceLM, _device_ids_for),):
    _cls.ids_for = _method


@entry_point
def a_method_patched_to_read_host_ids_in_a_loop(model: LoopPatchedToHostLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_host_ids_over_a_tuple_of_classes(model: ListedPatchedToHostLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_device_ids_in_a_loop(model: LoopPatchedToDeviceLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedInABlockLM(ServableLM):
    """Its body reads device ids; a patch inside a top-level ``try`` block replaces it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


try:
    PatchedInABlockLM.ids_for = _host_ids_for
except AttributeError:  # a patch applied where the library allows it, as patch modules guard them
    pass


@entry_point
def a_method_patched_to_read_host_ids_in_a_try_block(model: PatchedInABlockLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class ComputedLoopToHostLM(ServableLM):
    """Its body reads device ids; a loop over a computed tuple of classes patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class ComputedLoopToDeviceLM(ServableLM):
    """Its body reads host ids; a loop over computed (class, method) pairs patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


BASE_MODELS = ()
for _cls in (*BASE_MODELS, ComputedLoopToHostLM):
    _cls.ids_for = _host_ids_for

for _cls, _method in [*(), (ComputedLoopToDeviceLM, _device_ids_for)]:
    setattr(_cls, "ids_for", _method)  # noqa: B010 (the spelling under test)


@entry_point
def a_method_patched_to_read_host_ids_in_a_loop_over_computed_items(model: ComputedLoopToHostLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_device_ids_in_a_loop_over_computed_items(model: ComputedLoopToDeviceLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedByACallLM(ServableLM):
    """Reads device ids itself; ``apply_patches()``, called at import, patches it to read host ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class PatchedByACallWithTheClassLM(ServableLM):
    """Reads device ids itself; ``patch_ids_for(PatchedByACallWithTheClassLM, _host_ids_for)`` patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class RestoredByACallLM(ServableLM):
    """Reads host ids itself; a function called at import patches it to read device ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class NeverPatchedLM(ServableLM):
    """Reads device ids; the function that would patch it is never called."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


def apply_patches() -> None:
    """The way kernel libraries patch a model family: one function, called when they are imported."""
    PatchedByACallLM.ids_for = _host_ids_for


def patch_ids_for(cls: type, method: Callable[..., Tensor] = _device_ids_for) -> None:
    cls.ids_for = method


def never_called() -> None:
    NeverPatchedLM.ids_for = _host_ids_for


apply_patches()
patch_ids_for(PatchedByACallWithTheClassLM, _host_ids_for)
patch_ids_for(RestoredByACallLM)


@entry_point
def a_method_patched_to_read_host_ids_by_a_function_called_at_import(model: PatchedByACallLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_host_ids_by_a_function_given_the_class(model: PatchedByACallWithTheClassLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_device_ids_by_a_function_called_at_import(model: RestoredByACallLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_a_function_never_called_would_patch(model: NeverPatchedLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedInAComprehensionLM(ServableLM):
    """Reads device ids itself; a top-level comprehension patches it to read host ids."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class PatchedInATupleAssignmentLM(PatchedInAComprehensionLM):
    """Patched beside keeping its own member, in one tuple assignment."""


_comprehended = [setattr(c, "ids_for", _host_ids_for) for c in (PatchedInAComprehensionLM,)]
_kept_ids_for, PatchedInATupleAssignmentLM.ids_for = PatchedInATupleAssignmentLM.ids_for, _host_ids_for


@entry_point
def a_method_patched_to_read_host_ids_in_a_comprehension(model: PatchedInAComprehensionLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_host_ids_in_a_tuple_assignment(model: PatchedInATupleAssignmentLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedOverADictLM(ServableLM):
    """Reads device ids itself; a loop over a module-level dict of patches patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class RestoredOverADictLM(ServableLM):
    """Reads host ids itself; the same loop gives it a device-reading member."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class PatchedOverReversedItemsLM(PatchedOverADictLM):
    """Patched in a loop over ``reversed((...))``."""


PATCHES = {PatchedOverADictLM: _host_ids_for, RestoredOverADictLM: _device_ids_for}
for _cls, _method in PATCHES.items():
    _cls.ids_for = _method

for _cls in reversed((PatchedOverReversedItemsLM,)):
    _cls.ids_for = _host_ids_for


@entry_point
def a_method_patched_to_read_host_ids_over_a_dict_of_patches(model: PatchedOverADictLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_device_ids_over_a_dict_of_patches(model: RestoredOverADictLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_to_read_host_ids_over_reversed_items(model: PatchedOverReversedItemsLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PickedInALoopLM(ServableLM):
    """Reads device ids itself; a loop over mixed items patches the classes among them."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class SkippedInALoopLM(PickedInALoopLM):
    """Named in the same loop, but its ``if`` leaves it alone."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class SkippedByAFlagLM(PickedInALoopLM):
    """Patched only behind a module-level switch that is off."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


DEBUG_HOST_IDS = False

for _cls in (None, "legacy", PickedInALoopLM, SkippedInALoopLM):
    if isinstance(_cls, type) and _cls is not SkippedInALoopLM:
        _cls.ids_for = _host_ids_for

for _cls in (SkippedByAFlagLM,):
    if DEBUG_HOST_IDS:
        _cls.ids_for = _host_ids_for


@entry_point
def a_method_patched_to_read_host_ids_behind_a_test_in_a_loop(model: PickedInALoopLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_a_loop_test_leaves_alone(model: SkippedInALoopLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_only_behind_a_switch_that_is_off(model: SkippedByAFlagLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class DeviceParentLM(ServableLM):
    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class HostParentLM(ServableLM):
    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class HostOverrideDeletedLM(DeviceParentLM):
    """Overrides ``ids_for`` to read host ids; the override is deleted at import."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.host_tokens.ids


class DeviceOverrideDeletedLM(HostParentLM):
    """Overrides ``ids_for`` to read device ids; the override is deleted at import."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


del HostOverrideDeletedLM.ids_for  # the parent's member is what the class has now
delattr(DeviceOverrideDeletedLM, "ids_for")


@entry_point
def a_host_reading_override_deleted_at_import(model: HostOverrideDeletedLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_device_reading_override_deleted_at_import(model: DeviceOverrideDeletedLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedThroughALocalLM(ServableLM):
    """Reads device ids itself; a function called at import patches it through a local name."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class PatchedOnlyAsAScriptLM(ServableLM):
    """Reads device ids itself; only running the module as a script would patch it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


def patch_through_a_local() -> None:
    target = PatchedThroughALocalLM
    target.ids_for = _host_ids_for


patch_through_a_local()

if __name__ == "__main__":
    patch_ids_for(PatchedOnlyAsAScriptLM, _host_ids_for)


@entry_point
def a_method_patched_to_read_host_ids_through_a_local_of_a_function_called_at_import(model: PatchedThroughALocalLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_patched_only_when_the_module_runs_as_a_script(model: PatchedOnlyAsAScriptLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


class PatchedWhenEnabledLM(ServableLM):
    """Reads device ids itself; ``patch_when(PatchedWhenEnabledLM, enabled=True)`` patches it."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


class LeftAloneWhenDisabledLM(PatchedWhenEnabledLM):
    """Passed to the same function with ``enabled`` left at its default, False: not patched."""

    def ids_for(self, inp: ForwardInput) -> Tensor:
        return inp.embedding_ids()


def patch_when(cls: type, *, enabled: bool = False) -> None:
    if enabled:
        cls.ids_for = _host_ids_for


patch_when(PatchedWhenEnabledLM, enabled=True)
patch_when(LeftAloneWhenDisabledLM)


@entry_point
def a_method_patched_by_a_function_whose_switch_is_on(model: PatchedWhenEnabledLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)


@entry_point
def a_method_left_alone_by_a_function_whose_switch_is_off(model: LeftAloneWhenDisabledLM, inp: ForwardInput) -> Tensor:
    return model.logits(model.embed(model.ids_for(inp)), inp)
