"""Items of specs/routing-checker.md: the checker over the zoo's issue-13 idioms, and the type states.

Each checker item runs the checker over the zoo module that shows its idiom (honouring and ignoring
variants, tests/checker/zoo) and demands every expected verdict; its mutant reverts the one
rule, and the same test then reports a mismatch.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tokenstate.checker import CheckerConfig, EntryTarget, Verdict, check_entry_points
from tokenstate.contracts import (
    PLACEHOLDER,
    BatchLayout,
    ContractViolation,
    DeviceTokens,
    ForwardInput,
    HostTokens,
    checks_mode,
)

from .routing_checker_mutants import (
    analysed_decorators_assumed_identity,
    annotation_over_build,
    any_published_scope_makes_unresolved_calls_unknown,
    attribute_writes_forgotten,
    bool_values_are_flags,
    branch_facts_end_with_the_branch,
    buffers_fetched_by_name_are_copies,
    build_assignments_and_method_type_unseen,
    class_decorators_and_hooks_unseen,
    class_patching_by_direct_assignment_only,
    closures_defaults_and_caches_forget,
    code_given_as_text_is_data,
    code_handed_out_reaches_nothing,
    compiled_code_followed_as_plain,
    concatenated_lists_lose_their_elements,
    containers_filled_later_stay_empty,
    custom_ops_are_plain_kernels,
    decorators_evaluated_at_module_level_only,
    deleted_members_kept,
    depth_first_mro,
    descriptors_read_as_plain_attributes,
    device_ids_checked_in_full_mode_only,
    device_logits_indices_shape_only,
    dict_lookup_joins_every_value,
    dict_patch_loops_unseen,
    dicts_of_pairs_opaque,
    eafp_and_getattr_defaults_guard_nothing,
    early_returns_once_set_run_every_call,
    emptiness_tests_not_once_only,
    engine_spellings_of_shared_memory_unseen,
    every_forward_hook_is_unknown,
    exact_type_tests_as_isinstance,
    external_base_answers_every_member,
    external_methods_take_the_input_as_data,
    fills_seen_by_name_only,
    first_key_wins_and_slices_keep_all,
    first_step_blocks_run_every_call,
    flag_guarded_creations_written_by_every_call,
    forward_hooks_tried_without_the_input,
    forwards_set_on_instances_unseen,
    fresh_positions_checked_in_full_mode_only,
    getattribute_is_a_method_call,
    handlers_and_managers_inherit_the_body_facts,
    hook_containers_stay_as_built,
    hook_trials_count_only_reads,
    host_reads_taken_as_fresh,
    ids_kept_start_the_next_call_unseen,
    import_module_is_data,
    in_place_writes_dropped,
    inherited_embedding_forward_is_opaque,
    kwargs_spread_dropped,
    lazy_buffers_written_by_every_call,
    local_names_are_never_fixed,
    loop_exits_fall_through,
    loop_patches_unseen,
    match_binds_the_subject_only,
    match_cases_unguarded,
    methods_see_the_objects_as_built,
    module_and_class_state_read_as_defined,
    module_dict_attributes_opaque,
    module_level_class_patches_unseen,
    module_objects_written_out_of_sight,
    module_table_writes_by_a_computed_name_lost,
    named_tuples_iterated_as_opaque_objects,
    names_spelt_at_run_time_unseen,
    new_taken_to_build_its_class,
    none_beside_device_tokens_dropped,
    once_only_flags_in_few_spellings,
    one_level_of_star_imports,
    only_embedding_sinks_count,
    only_is_none_guards,
    only_suppress_swallows,
    patch_statement_shapes_unseen,
    patches_from_other_modules_unseen,
    patches_in_loop_tests_unseen,
    patches_seen_before_they_run,
    patching_calls_at_import_unfollowed,
    raised_tokens_dropped,
    record_methods_opaque,
    records_built_from_their_own_annotations,
    registries_indexed_as_data,
    replaced_init_followed_and_constants_unread,
    replacement_filters_ignored,
    replacement_passes_unseen,
    rows_and_replaced_inputs_unseen,
    single_dispatch_is_a_plain_decorator,
    stale_mask_is_data,
    stale_row_tests_are_not_values,
    stale_rows_tuple_is_data,
    star_args_get_no_input,
    state_dumps_read_nothing,
    state_kept_for_the_next_step_unseen,
    stored_tests_keep_guarding,
    stored_values_stay_fresh,
    submodule_paths_opaque,
    submodule_walks_opaque,
    thread_jobs_called_out_of_sight,
    to_device_loses_the_class,
    tokens_sent_into_generators_dropped,
    views_are_separate_values,
    walrus_buffers_unseen,
    writes_handed_out_stale,
)
from .routing_checker_runtime import run_async, watch_placeholder_reads, zoo_on_path

ZOO_ROOT = Path(__file__).resolve().parents[2] / "tests" / "checker" / "zoo"


@functools.cache
def _zoo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("routing_checker_zoo_expected", ZOO_ROOT / "expected.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verdicts(pattern: str) -> dict[str, tuple[str, str]]:
    """entry -> (expected, got) for every zoo case of ``pattern`` (at least one of each kind shown)."""
    zoo = _zoo()
    cases = [(m, f) for (m, f), (_, p) in zoo.EXPECTED.items() if p == pattern]
    assert cases, f"no zoo case for {pattern!r}"
    targets = [EntryTarget(f"{m}.{f}", m, f, None, *zoo.BUILD_FUNCTIONS.get((m, f), (None, None))) for m, f in cases]
    report = check_entry_points(targets, CheckerConfig(search_paths=(ZOO_ROOT,), display_root=ZOO_ROOT))
    return {r.entry: (zoo.EXPECTED[(r.entry.rpartition(".")[0], r.entry.rpartition(".")[2])][0], r.verdict.value)
            for r in report.results}


def assert_zoo(pattern: str, kinds: set[str]) -> None:
    got = verdicts(pattern)
    assert {expected for expected, _ in got.values()} >= kinds, f"{pattern}: missing a variant"
    wrong = {e: v for e, v in got.items() if v[0] != v[1]}
    assert wrong == {}, f"{pattern}: (expected, got) {wrong}"


@pytest.mark.paid("RCK-15", before=host_reads_taken_as_fresh)
def test_static_verdict_and_async_runtime_agree_on_every_zoo_case():
    zoo = _zoo()
    cases = [(m, f) for (m, f), (verdict, _) in zoo.EXPECTED.items() if verdict != "unknown"]
    targets = [EntryTarget(f"{m}.{f}", m, f, True, *zoo.BUILD_FUNCTIONS.get((m, f), (None, None))) for m, f in cases]
    report = check_entry_points(targets, CheckerConfig(search_paths=(ZOO_ROOT,), display_root=ZOO_ROOT))
    disagreements = {}
    with zoo_on_path(), watch_placeholder_reads():
        for result in report.results:
            if result.verdict is Verdict.UNKNOWN:  # never passed: nothing to agree with
                continue
            module, _, forward = result.entry.rpartition(".")
            outcome = run_async(module, forward, zoo.BUILD_FUNCTIONS.get((module, forward)))
            if result.verdict is Verdict.IGNORES:  # raises, or (host ids cached from an earlier step) diverges
                agrees = outcome == "fails" or outcome.startswith("diverges")
            else:
                agrees = outcome == "agrees-pass"
            if not agrees:
                disagreements[result.entry] = (result.verdict.value, outcome)
    assert len(cases) >= 75 and {v for v, _ in zoo.EXPECTED.values()} >= {"honors", "ignores", "inert"}
    assert disagreements == {}, disagreements


@pytest.mark.paid("RCK-1", before=only_embedding_sinks_count)
def test_non_embedding_host_reads_are_findings():
    assert_zoo("non-embedding host read", {"honors", "ignores"})
    assert_zoo("host-id read for metadata", {"ignores"})


@pytest.mark.paid("RCK-2", before=depth_first_mro)
def test_method_resolution_is_c3():
    assert_zoo("C3 method resolution", {"honors", "ignores"})


@pytest.mark.paid("RCK-3", before=to_device_loses_the_class)
def test_module_methods_returning_self_keep_the_class():
    assert_zoo("build returns Model(cfg).to(device)", {"honors", "ignores"})


@pytest.mark.paid("RCK-4", before=annotation_over_build)
def test_built_subclass_wins_over_annotated_base():
    assert_zoo("annotated base, built subclass", {"honors", "ignores"})


@pytest.mark.paid("RCK-5", before=dict_lookup_joins_every_value)
def test_constant_key_dispatch_resolves_one_value():
    assert_zoo("constant-key dict dispatch", {"honors", "ignores"})


@pytest.mark.paid("RCK-6", before=only_is_none_guards)
def test_isinstance_and_helper_predicates_guard():
    assert_zoo("freshness guard (isinstance / helper)", {"honors", "ignores"})


@pytest.mark.paid("RCK-7", before=inherited_embedding_forward_is_opaque)
def test_embedding_subclass_super_forward_is_a_sink():
    assert_zoo("nn.Embedding subclass, super().forward", {"honors", "ignores"})


@pytest.mark.paid("RCK-8", before=kwargs_spread_dropped)
def test_kwargs_plumbing_keeps_the_ids():
    assert_zoo("**kwargs plumbing", {"honors", "ignores"})


@pytest.mark.paid("RCK-9", before=import_module_is_data)
def test_import_module_is_resolved_or_unknown():
    assert_zoo("importlib.import_module", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-10", before=attribute_writes_forgotten)
def test_self_state_crosses_methods():
    assert_zoo("self attribute across methods", {"honors", "ignores"})


@pytest.mark.paid("RCK-11", before=compiled_code_followed_as_plain)
def test_compiled_and_checkpointed_code_is_unknown():
    assert_zoo("decorators and compiled code", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-16", before=external_base_answers_every_member)
def test_plain_mixins_after_nn_module_are_reached():
    assert_zoo("plain mixin after nn.Module", {"honors", "ignores"})


@pytest.mark.paid("RCK-17", before=bool_values_are_flags)
def test_and_or_values_are_the_operand_python_returns():
    assert_zoo("and/or as values", {"honors", "ignores"})


@pytest.mark.paid("RCK-18", before=match_cases_unguarded)
def test_match_on_the_device_tokens_guards():
    assert_zoo("match on the device tokens", {"honors", "ignores"})


@pytest.mark.paid("RCK-19", before=external_methods_take_the_input_as_data)
def test_external_methods_handed_the_input_are_unknown(tmp_path: Path):
    # An engine library that is not installed here (so not loaded): its base class may define
    # token_ids, and what that method does with inp is out of sight.
    package = tmp_path / "rck19"
    package.mkdir(exist_ok=True)  # the ledger re-runs a paid test on the same tmp_path
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        "from some_engine_lib import PreTrainedBase\n"
        "from tokenstate.runtime.kernels import guarded_embedding\n\n"
        "class Model(PreTrainedBase):\n    pass\n\n"
        "def forward(model: Model, inp):\n    return guarded_embedding(model.token_ids(inp), None)\n"
    )
    config = CheckerConfig(search_paths=(tmp_path,), display_root=tmp_path)
    (result,) = check_entry_points([EntryTarget("rck19", "rck19.model", "forward", True)], config).results
    assert result.error is None, result.error
    assert result.verdict is Verdict.UNKNOWN, result.verdict


@pytest.mark.paid("RCK-20", before=handlers_and_managers_inherit_the_body_facts)
def test_try_handlers_and_swallowing_managers_keep_only_the_facts_they_entered_with():
    assert_zoo("facts through try and with", {"honors", "ignores"})


@pytest.mark.paid("RCK-21", before=branch_facts_end_with_the_branch)
def test_early_returns_in_elif_chains_and_match_cases_guard_what_follows():
    assert_zoo("early returns in elif and match", {"honors", "ignores"})


@pytest.mark.paid("RCK-22", before=stored_values_stay_fresh)
def test_host_ids_cached_on_the_model_are_not_fresh_on_later_calls():
    assert_zoo("host values stored beyond the call", {"honors", "ignores"})


@pytest.mark.paid("RCK-23", before=containers_filled_later_stay_empty)
def test_containers_filled_after_they_are_built_hold_what_was_put_in():
    assert_zoo("containers filled after they are built", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-24", before=star_args_get_no_input)
def test_pass_through_star_args_entry_points_receive_the_input():
    assert_zoo("pass-through *args", {"honors", "ignores"})


@pytest.mark.paid("RCK-25", before=module_dict_attributes_opaque)
def test_module_dict_entries_reached_by_attribute_are_followed():
    assert_zoo("ModuleDict attributes", {"honors", "ignores"})


@pytest.mark.paid("RCK-26", before=loop_exits_fall_through)
def test_continue_and_break_under_the_guard_end_the_rest_of_the_loop_body():
    assert_zoo("loop exits under the guard", {"honors", "ignores"})


@pytest.mark.paid("RCK-27", before=in_place_writes_dropped)
def test_ids_written_into_a_buffer_in_place_are_held_by_it():
    assert_zoo("buffers filled in place", {"honors", "ignores"})


@pytest.mark.paid("RCK-28", before=none_beside_device_tokens_dropped)
def test_device_tokens_that_may_be_none_for_another_reason_guard_nothing():
    assert_zoo("device tokens or None", {"honors", "ignores"})


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.paid("RCK-12", before=device_ids_checked_in_full_mode_only)
def test_device_tokens_refuse_placeholders_on_the_cpu():
    with checks_mode("boundary"):
        for ids in ([3, PLACEHOLDER, 4], [3, 50]):
            with pytest.raises(ContractViolation, match=r"ids must lie in \[0, 50\)"):
                DeviceTokens.from_combine(i32(ids), vocab_size=50)
        assert DeviceTokens.from_combine(i32([0, 49]), vocab_size=50).ids.tolist() == [0, 49]


@pytest.mark.paid("RCK-13", before=fresh_positions_checked_in_full_mode_only)
def test_host_tokens_refuse_placeholders_at_fresh_positions():
    with checks_mode("boundary"), pytest.raises(ContractViolation, match=r"positions \[1\] are not marked stale"):
        HostTokens.fresh(i32([3, PLACEHOLDER]), i32([0, 2]), i32([0]))


@pytest.mark.paid("RCK-14", before=device_logits_indices_shape_only)
def test_forward_input_refuses_logits_past_num_tokens():
    qsl, slots = i32([0, 2, 3]), i32([1, 0])
    host = HostTokens.fresh(i32([3, 4, 5]), qsl, slots)
    logits = torch.tensor([1, 2])  # [num_logits] int64
    layout = BatchLayout(qsl, i32([2, 4]), slots, i32([0, 0]), logits)
    inp = ForwardInput(host, None, torch.tensor([0, 1, 3]), layout, logits.clone(), slots.long())
    with pytest.raises(ContractViolation, match=r"logits_indices must lie in \[0, num_tokens=3\)"):
        dataclasses.replace(inp, logits_indices=torch.tensor([1, 3]))


@pytest.mark.paid("RCK-29", before=analysed_decorators_assumed_identity)
def test_decorators_of_the_package_are_followed():
    assert_zoo("analysed decorators", {"honors", "ignores"})


@pytest.mark.paid("RCK-30", before=class_decorators_and_hooks_unseen)
def test_class_decorators_that_assign_methods_and_forward_hooks_are_unknown():
    assert_zoo("class decorators and forward hooks", {"unknown"})


@pytest.mark.paid("RCK-31", before=getattribute_is_a_method_call)
def test_attribute_reads_spelt_as_calls_are_attribute_reads():
    assert_zoo("attribute reads spelt as calls", {"ignores"})


@pytest.mark.paid("RCK-32", before=first_key_wins_and_slices_keep_all)
def test_dict_keys_and_slices_are_read_as_python_reads_them():
    assert_zoo("containers read as Python reads them", {"honors", "ignores"})


@pytest.mark.paid("RCK-33", before=match_binds_the_subject_only)
def test_match_patterns_bind_what_they_capture():
    assert_zoo("match pattern captures", {"honors", "ignores"})


@pytest.mark.paid("RCK-34", before=stale_row_tests_are_not_values)
def test_stale_row_tests_guard_through_locals_helpers_and_not():
    assert_zoo("stale-row tests as values", {"honors"})


@pytest.mark.paid("RCK-35", before=stored_tests_keep_guarding)
def test_a_freshness_test_stored_on_the_model_guards_nothing_later():
    assert_zoo("freshness tests stored beyond the call", {"ignores"})


@pytest.mark.paid("RCK-36", before=decorators_evaluated_at_module_level_only)
def test_decorators_are_evaluated_where_the_def_stands():
    assert_zoo("decorators where they stand", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-37", before=class_patching_by_direct_assignment_only)
def test_class_level_patching_makes_the_members_unknown():
    assert_zoo("class-level patching", {"honors", "unknown"})


@pytest.mark.paid("RCK-38", before=descriptors_read_as_plain_attributes)
def test_a_descriptor_reads_as_what_its_get_returns():
    assert_zoo("descriptors", {"ignores"})


@pytest.mark.paid("RCK-39", before=single_dispatch_is_a_plain_decorator)
def test_single_dispatch_is_unknown():
    assert_zoo("dispatch by argument type", {"unknown"})


@pytest.mark.paid("RCK-40", before=only_suppress_swallows)
def test_exit_stacks_suppress_subclasses_and_managers_yielding_in_suppress_swallow():
    assert_zoo("managers that swallow", {"ignores"})


@pytest.mark.paid("RCK-41", before=concatenated_lists_lose_their_elements)
def test_layers_built_as_vllm_builds_them_are_followed():
    assert_zoo("layers built as vLLM builds them", {"honors", "ignores"})


@pytest.mark.paid("RCK-42", before=replaced_init_followed_and_constants_unread)
def test_class_decorators_of_compiling_engines():
    assert_zoo("class decorators of compiling engines", {"honors", "unknown"})


@pytest.mark.paid("RCK-43", before=any_published_scope_makes_unresolved_calls_unknown)
def test_unresolved_calls_under_a_scope_without_ids_are_not_unknown():
    assert_zoo("scopes that hold no ids", {"honors"})


@pytest.mark.paid("RCK-44", before=local_names_are_never_fixed)
def test_names_from_literal_loops_and_class_constants_are_read():
    assert_zoo("transformers plumbing", {"honors", "ignores"})


@pytest.mark.paid("RCK-45", before=registries_indexed_as_data)
def test_a_registry_indexed_with_brackets_calls_its_getitem():
    assert_zoo("transformers plumbing", {"honors", "ignores"})


@pytest.mark.paid("RCK-46", before=every_forward_hook_is_unknown)
def test_a_plain_forward_hook_that_touches_no_ids_is_left_out():
    assert_zoo("transformers plumbing", {"honors", "ignores"})


@pytest.mark.paid("RCK-47", before=one_level_of_star_imports)
def test_names_re_exported_through_nested_star_imports_resolve():
    assert_zoo("nested star exports", {"honors", "ignores"})


@pytest.mark.paid("RCK-48", before=code_handed_out_reaches_nothing)
def test_code_handed_to_threads_that_reaches_the_input_is_unknown():
    assert_zoo("code handed to threads", {"honors", "unknown"})


@pytest.mark.paid("RCK-49", before=forward_hooks_tried_without_the_input)
def test_a_forward_hook_reading_the_input_from_its_args_is_unknown():
    assert_zoo("class decorators and forward hooks", {"unknown"})


@pytest.mark.paid("RCK-50", before=build_assignments_and_method_type_unseen)
def test_a_method_bound_by_hand_in_build_is_analysed():
    assert_zoo("methods bound or patched by hand", {"ignores"})


@pytest.mark.paid("RCK-51", before=module_level_class_patches_unseen)
def test_a_class_patched_after_its_body_is_analysed():
    assert_zoo("methods bound or patched by hand", {"ignores"})


@pytest.mark.paid("RCK-52", before=stale_rows_tuple_is_data)
def test_an_empty_stale_rows_tuple_guards_host_reads():
    assert_zoo("stale-rows tuple as a guard", {"honors", "ignores"})


@pytest.mark.paid("RCK-53", before=state_kept_for_the_next_step_unseen)
def test_tokens_kept_on_the_model_for_the_next_step_are_read_there():
    assert_zoo("state kept for the next step", {"honors", "ignores"})


@pytest.mark.paid("RCK-54", before=code_given_as_text_is_data)
def test_code_given_as_text_where_the_locals_hold_the_input_is_unknown():
    assert_zoo("code given as text", {"unknown"})


@pytest.mark.paid("RCK-55", before=raised_tokens_dropped)
def test_tokens_carried_by_an_exception_are_read_in_its_handler():
    assert_zoo("tokens raised or sent", {"ignores", "unknown"})


@pytest.mark.paid("RCK-56", before=tokens_sent_into_generators_dropped)
def test_tokens_sent_into_a_generator_are_unknown():
    assert_zoo("tokens raised or sent", {"ignores", "unknown"})


@pytest.mark.paid("RCK-57", before=eafp_and_getattr_defaults_guard_nothing)
def test_eafp_and_getattr_defaults_on_the_device_tokens_guard_host_reads():
    assert_zoo("EAFP and getattr defaults on the device tokens", {"honors", "ignores"})


@pytest.mark.paid("RCK-58", before=state_dumps_read_nothing)
def test_the_raw_buffer_through_the_tokens_state_is_a_raw_read():
    assert_zoo("raw buffer through introspection", {"ignores"})


@pytest.mark.paid("RCK-59", before=hook_containers_stay_as_built)
def test_a_hook_reading_a_container_the_forward_fills_is_unknown():
    assert_zoo("class decorators and forward hooks", {"unknown"})
    assert_zoo("forward hooks over containers", {"honors"})


@pytest.mark.paid("RCK-60", before=thread_jobs_called_out_of_sight)
def test_a_pool_job_given_the_input_is_followed_as_the_call_it_is():
    assert_zoo("thread jobs given the input", {"honors", "ignores"})


@pytest.mark.paid("RCK-61", before=hook_trials_count_only_reads)
def test_a_hook_reaching_the_raw_buffer_through_gc_is_not_plain():
    assert_zoo("forward hooks handing tokens out of sight", {"unknown", "honors"})


@pytest.mark.paid("RCK-62", before=module_and_class_state_read_as_defined)
def test_state_kept_in_globals_and_class_attributes_is_not_fresh_on_later_calls():
    assert_zoo("state kept beyond the call", {"honors", "ignores"})


@pytest.mark.paid("RCK-63", before=rows_and_replaced_inputs_unseen)
def test_per_row_stale_tests_and_replaced_inputs_are_followed():
    assert_zoo("per-row stale tests and rebuilt inputs", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-64", before=writes_handed_out_stale)
def test_ids_one_method_stages_are_read_by_another_in_the_same_call():
    assert_zoo("state staged by one call, read by another", {"honors", "ignores"})


@pytest.mark.paid("RCK-65", before=fills_seen_by_name_only)
def test_fills_in_place_are_seen_however_they_are_spelt():
    assert_zoo("state written in place, however spelt", {"honors", "ignores", "unknown"})


@pytest.mark.paid("RCK-66", before=views_are_separate_values)
def test_a_buffer_filled_through_a_view_holds_what_the_view_was_given():
    assert_zoo("a buffer filled through another view of its memory", {"honors", "ignores"})


@pytest.mark.paid("RCK-67", before=names_spelt_at_run_time_unseen)
def test_state_kept_under_a_name_spelt_at_run_time_is_the_assignment_it_spells():
    assert_zoo("state kept under a name spelt at run time", {"honors", "ignores"})


@pytest.mark.paid("RCK-68", before=closures_defaults_and_caches_forget)
def test_state_kept_in_closures_defaults_and_cached_factories_is_read_back():
    assert_zoo("state kept in a closure, a default argument or a cached factory", {"honors", "ignores"})


@pytest.mark.paid("RCK-69", before=engine_spellings_of_shared_memory_unseen)
def test_memory_shared_or_kept_is_seen_as_engines_spell_it():
    assert_zoo("memory shared or kept, spelt as engines spell it", {"honors", "ignores"})


@pytest.mark.paid("RCK-70", before=methods_see_the_objects_as_built)
def test_a_runners_methods_read_what_its_callers_staged():
    assert_zoo("a runner's methods read what its callers staged", {"honors", "ignores"})


@pytest.mark.paid("RCK-71", before=module_objects_written_out_of_sight)
def test_a_modules_global_written_through_the_module_object_is_kept():
    assert_zoo("a module's global written through the module object", {"honors", "ignores"})


@pytest.mark.paid("RCK-72", before=records_built_from_their_own_annotations)
def test_a_step_record_holds_what_its_generated_init_and_post_init_give_it():
    assert_zoo("a step record built as engines build them", {"honors", "ignores"})


@pytest.mark.paid("RCK-73", before=patches_from_other_modules_unseen)
def test_a_method_patched_by_another_module_of_the_package_is_the_patch():
    assert_zoo("a method patched by another module of the package", {"honors", "ignores"})


@pytest.mark.paid("RCK-74", before=replacement_passes_unseen)
def test_submodules_a_replacement_pass_swaps_are_the_wrappers():
    assert_zoo("submodules replaced by a module-replacement pass", {"honors", "ignores"})


@pytest.mark.paid("RCK-75", before=lazy_buffers_written_by_every_call)
def test_a_buffer_created_lazily_holds_what_earlier_calls_left():
    assert_zoo("a buffer created lazily on the first call", {"honors", "ignores"})


@pytest.mark.paid("RCK-76", before=ids_kept_start_the_next_call_unseen)
def test_ids_kept_by_one_call_are_read_by_the_next_as_kept():
    assert_zoo("ids kept by one call and read by the next before it writes them", {"inert", "ignores"})


@pytest.mark.paid("RCK-77", before=new_taken_to_build_its_class)
def test_an_instance_whose_new_may_build_another_class_is_unknown():
    assert_zoo("a class whose __new__ may build another class", {"honors", "unknown"})


@pytest.mark.paid("RCK-78", before=custom_ops_are_plain_kernels)
def test_a_custom_op_called_after_ids_were_kept_where_it_may_read_them_is_unknown():
    assert_zoo("a custom op registered with torch.library", {"honors", "unknown"})


@pytest.mark.paid("RCK-79", before=stale_mask_is_data)
def test_the_stale_position_masks_any_guards_host_reads():
    assert_zoo("the stale-position mask as a guard", {"honors", "ignores"})


@pytest.mark.paid("RCK-80", before=patches_seen_before_they_run)
def test_a_patch_calls_the_member_it_replaced():
    assert_zoo("a method patch calling the member it replaced", {"honors", "ignores"})


@pytest.mark.paid("RCK-81", before=loop_patches_unseen)
def test_a_method_patched_in_a_loop_is_the_patch():
    assert_zoo("a method patched in a loop over classes", {"honors", "ignores"})


@pytest.mark.paid("RCK-82", before=named_tuples_iterated_as_opaque_objects)
def test_iterating_a_named_tuple_gives_its_fields():
    assert_zoo("a NamedTuple step record iterated", {"honors", "ignores"})


@pytest.mark.paid("RCK-83", before=flag_guarded_creations_written_by_every_call)
def test_a_buffer_created_behind_a_ready_flag_holds_what_earlier_calls_left():
    assert_zoo("a buffer created once behind a ready flag", {"honors", "ignores"})


@pytest.mark.paid("RCK-84", before=submodule_walks_opaque)
def test_submodules_a_pass_over_named_modules_swaps_are_the_wrappers():
    assert_zoo("submodules replaced over named_modules()", {"honors", "ignores"})


@pytest.mark.paid("RCK-86", before=submodule_paths_opaque)
def test_submodules_reached_by_their_dotted_path_are_the_ones_set():
    assert_zoo("submodules reached by their dotted path", {"honors", "ignores"})


@pytest.mark.paid("RCK-87", before=record_methods_opaque)
def test_a_named_tuple_as_a_dict_or_replaced_keeps_its_fields():
    assert_zoo("a NamedTuple step record as a dict or replaced", {"honors", "ignores"})


@pytest.mark.paid("RCK-88", before=first_step_blocks_run_every_call)
def test_a_buffer_created_on_the_first_step_holds_what_earlier_calls_left():
    assert_zoo("a buffer created on the first step a counter counts", {"honors", "ignores"})


@pytest.mark.paid("RCK-89", before=module_table_writes_by_a_computed_name_lost)
def test_a_submodule_replaced_through_the_module_table_is_the_wrapper():
    assert_zoo("submodules replaced through the module table", {"honors", "ignores"})


@pytest.mark.paid("RCK-90", before=patching_calls_at_import_unfollowed)
def test_a_method_patched_by_a_function_called_at_import_is_the_patch():
    assert_zoo("a method patched by a function called at import", {"honors", "ignores"})


@pytest.mark.paid("RCK-91", before=emptiness_tests_not_once_only)
def test_a_buffer_allocated_while_empty_holds_what_earlier_calls_left():
    assert_zoo("a buffer allocated once while it is empty", {"honors", "ignores"})


@pytest.mark.paid("RCK-92", before=dicts_of_pairs_opaque)
def test_a_dict_built_from_pairs_holds_their_values():
    assert_zoo("a NamedTuple zipped with its field names", {"honors", "ignores"})


@pytest.mark.paid("RCK-93", before=replacement_filters_ignored)
def test_a_replacement_pass_replaces_only_what_its_filter_lets_through():
    assert_zoo("a replacement pass's own filter", {"honors", "ignores"})


@pytest.mark.paid("RCK-94", before=exact_type_tests_as_isinstance)
def test_an_exact_type_test_narrows_to_that_class_only():
    assert_zoo("a replacement pass filtered by exact type", {"honors", "ignores"})


@pytest.mark.paid("RCK-95", before=once_only_flags_in_few_spellings)
def test_a_buffer_created_once_behind_a_flag_in_any_spelling_holds_what_earlier_calls_left():
    assert_zoo("a buffer created once behind a flag, spelt otherwise", {"honors", "ignores"})


@pytest.mark.paid("RCK-96", before=early_returns_once_set_run_every_call)
def test_a_buffer_allocated_after_an_early_return_once_set_holds_what_earlier_calls_left():
    assert_zoo("a buffer allocated after an early return once set", {"honors", "ignores"})


@pytest.mark.paid("RCK-97", before=patch_statement_shapes_unseen)
def test_a_method_patched_in_a_comprehension_or_a_tuple_assignment_is_the_patch():
    assert_zoo("a method patched in a comprehension or a tuple assignment", {"ignores"})


@pytest.mark.paid("RCK-98", before=dict_patch_loops_unseen)
def test_a_method_patched_over_a_dict_of_patches_is_the_patch():
    assert_zoo("a method patched in a loop over a dict of patches", {"honors", "ignores"})


@pytest.mark.paid("RCK-99", before=patches_in_loop_tests_unseen)
def test_a_patch_behind_an_if_in_a_loop_applies_where_its_test_may_hold():
    assert_zoo("a method patched behind an if in a loop", {"honors", "ignores"})


@pytest.mark.paid("RCK-100", before=forwards_set_on_instances_unseen)
def test_a_forward_set_on_the_instance_is_what_calling_the_module_runs():
    assert_zoo("a module whose forward is set on the instance", {"honors", "ignores"})


@pytest.mark.paid("RCK-101", before=deleted_members_kept)
def test_a_member_deleted_at_import_is_the_next_class_s():
    assert_zoo("a method deleted from its class at import", {"honors", "ignores"})


@pytest.mark.paid("RCK-102", before=walrus_buffers_unseen)
def test_a_buffer_found_and_created_through_a_walrus_holds_what_earlier_calls_left():
    assert_zoo("a buffer found and created through a walrus", {"honors", "ignores"})


@pytest.mark.paid("RCK-103", before=buffers_fetched_by_name_are_copies)
def test_a_buffer_fetched_by_getattr_is_the_attribute_it_names():
    assert_zoo("a buffer filled through a local that names it", {"ignores"})


OWED_VARIANTS = Path(__file__).resolve().parent / "owed_variants"
"""A package of the forwards the probes found that the checker still judges wrongly (RCK-85): each with its right verdict."""


@pytest.mark.owed("RCK-85")
def test_later_variants_of_patched_and_replaced_state_are_judged_right():
    spec = importlib.util.spec_from_file_location("owed_later_variants", OWED_VARIANTS / "later" / "variants.py")
    variants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variants)  # the right verdicts it lists; the checker reads its source
    targets = [
        EntryTarget(name, "later.variants", name, True, *(("later.variants", build) if build else (None, None)))
        for name, (_, build) in variants.EXPECTED.items()
    ]
    report = check_entry_points(targets, CheckerConfig(search_paths=(OWED_VARIANTS,), display_root=OWED_VARIANTS))
    assert {r.entry: r.verdict.value for r in report.results} == {n: v for n, (v, _) in variants.EXPECTED.items()}
