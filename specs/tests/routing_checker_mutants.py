"""Mutants of the routing-checker spec: each reverts exactly one rule a paid item depends on."""

from __future__ import annotations

import ast
import contextlib
import dataclasses

import tokenstate.checker.calls as calls_module
import tokenstate.checker.engine as engine_module
import tokenstate.checker.evaluate as evaluate_module
import tokenstate.checker.execute as execute_module
import tokenstate.checker.externals as externals_module
import tokenstate.checker.patches as patches_module
import tokenstate.checker.resolve as resolve_module
import tokenstate.checker.views as views_module
import tokenstate.contracts.forward_input as forward_input_module
import tokenstate.contracts.tokens as tokens_module
from tokenstate.checker.calls import RecordField
from tokenstate.checker.engine import Analyzer
from tokenstate.checker.frame import Frame
from tokenstate.checker.guards import Facts
from tokenstate.checker.resolve import decorator_names
from tokenstate.checker.values import (
    OPAQUE,
    Bound,
    ClassRef,
    External,
    Func,
    GenCM,
    Input,
    Instance,
    MapV,
    Seq,
    Tokens,
    Unknown,
    join,
    taint,
)
from tokenstate.ledger import MutantPatch, mutant


@mutant(
    "RCK-1/only-embedding-sinks-count",
    doc="A host-id read is only a finding when the ids reach an embedding (the checker before issue "
    "13): penalties, bias tables, len() and logging over host ids pass.",
)
def only_embedding_sinks_count(patch: MutantPatch) -> None:
    def host_read(self, frame, kind, what, node):  # type: ignore[no-untyped-def]
        return self.origin(frame, kind, what, node)

    patch.setattr(Analyzer, "host_read", host_read)


@mutant(
    "RCK-2/depth-first-mro",
    doc="Methods resolve depth-first, left to right (each class once), instead of by C3.",
)
def depth_first_mro(patch: MutantPatch) -> None:
    def mro(self, cls):  # type: ignore[no-untyped-def]
        if cls in self._mro:
            return self._mro[cls]
        self._mro[cls] = [cls]
        frame = self.module_frame(self.class_module(cls))
        order = [cls]
        for base_expr in cls.node.bases:
            base = self.eval(frame, base_expr)
            for option in getattr(base, "options", (base,)):
                if isinstance(option, ClassRef):
                    parents = list(self.mro(option.info))
                elif isinstance(option, External):
                    parents = [option]
                else:
                    continue
                order += [p for p in parents if p not in order]
        self._mro[cls] = order
        return order

    patch.setattr(Analyzer, "mro", mro)


@mutant(
    "RCK-3/to-device-loses-the-class",
    doc="nn.Module methods that return the module (.to, .eval...) give plain data, so "
    "`Model(cfg).to(device)` has no class.",
)
def to_device_loses_the_class(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "RETURNS_SELF", frozenset())
    patch.setattr(evaluate_module, "RETURNS_SELF", frozenset())


@mutant(
    "RCK-4/annotation-over-build",
    doc="An annotated model parameter wins over what the factory's build returns.",
)
def annotation_over_build(patch: MutantPatch) -> None:
    original = Analyzer.model_value

    def model_value(self, frame, target, annotation):  # type: ignore[no-untyped-def]
        if annotation is not None:
            target = dataclasses.replace(target, model_module=None, model_qualname=None)
        return original(self, frame, target, annotation)

    patch.setattr(Analyzer, "model_value", model_value)


@mutant(
    "RCK-5/dict-lookup-joins-every-value",
    doc="Any dict lookup may give any value of the dict, constant key or not.",
)
def dict_lookup_joins_every_value(patch: MutantPatch) -> None:
    patch.setattr(MapV, "lookup", lambda self, key: self.values)


@mutant(
    "RCK-6/only-is-none-guards",
    doc="Only `inp.device_tokens is None` (and truthiness) guard: isinstance on the device tokens and "
    "helper predicates give no freshness.",
)
def only_is_none_guards(patch: MutantPatch) -> None:
    original = Analyzer.isinstance_facts
    nothing = Facts(False, {})

    def isinstance_facts(self, frame, subject, classes, *, exact=False):  # type: ignore[no-untyped-def]
        if self.eval(frame, subject) == Tokens("device"):
            return nothing, nothing
        return original(self, frame, subject, classes, exact=exact)

    patch.setattr(Analyzer, "isinstance_facts", isinstance_facts)
    patch.setattr(Analyzer, "flag_of", lambda self, frame, test: None)


@mutant(
    "RCK-7/inherited-embedding-forward-is-opaque",
    doc="A method inherited from an external base (nn.Embedding.forward via super()) is a plain "
    "tensor method, not the embedding.",
)
def inherited_embedding_forward_is_opaque(patch: MutantPatch) -> None:
    original = Analyzer.bind_member

    def bind_member(self, frame, member, receiver, node):  # type: ignore[no-untyped-def]
        if isinstance(member, External):
            return Bound(OPAQUE, member.dotted.rpartition(".")[2])
        return original(self, frame, member, receiver, node)

    patch.setattr(Analyzer, "bind_member", bind_member)


@mutant(
    "RCK-8/kwargs-spread-dropped",
    doc="`f(**kwargs)` passes nothing: the keyword spread is dropped, as before issue 13.",
)
def kwargs_spread_dropped(patch: MutantPatch) -> None:
    def keywords(self, frame: Frame, keywords: list[ast.keyword]):  # type: ignore[no-untyped-def]
        return tuple((kw.arg, self.eval(frame, kw.value)) for kw in keywords if kw.arg is not None)

    patch.setattr(Analyzer, "keywords", keywords)


@mutant(
    "RCK-9/import-module-is-data",
    doc="importlib.import_module(...) returns plain data (an external call), so what the module "
    "holds is never followed and its embeddings vanish.",
)
def import_module_is_data(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "import_module", lambda self, frame, dotted, node: OPAQUE)


@mutant(
    "RCK-10/attribute-writes-forgotten",
    doc="Attributes assigned on a model outside its own method (model.prepare(inp); model.run()) "
    "are forgotten.",
)
def attribute_writes_forgotten(patch: MutantPatch) -> None:
    patch.setattr(Frame, "record_writes", lambda self, info, writes: None)


@mutant(
    "RCK-11/compiled-code-followed-as-plain",
    doc="Decorators and external wrappers are assumed to run the code they are given as is: "
    "@torch.compile is followed like any decorator, torch.compile(f)/checkpoint(f, x) are tensor ops.",
)
def compiled_code_followed_as_plain(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "opaque_wrapper", lambda self, func: None)
    patch.setattr(externals_module, "is_code", lambda value: False)


@mutant(
    "RCK-12/device-ids-checked-in-full-mode-only",
    doc="DeviceTokens checks its ids against the vocabulary only in `full` mode (the default "
    "`boundary` mode accepted PLACEHOLDER).",
)
def device_ids_checked_in_full_mode_only(patch: MutantPatch) -> None:
    original = tokens_module._check_in_vocabulary

    def check(ids, vocab_size):  # type: ignore[no-untyped-def]
        from tokenstate.contracts import get_checks_mode

        if get_checks_mode() == "full":
            original(ids, vocab_size)

    patch.setattr(tokens_module, "_check_in_vocabulary", check)


@mutant(
    "RCK-13/fresh-positions-checked-in-full-mode-only",
    doc="HostTokens checks fresh positions for placeholders only in `full` mode.",
)
def fresh_positions_checked_in_full_mode_only(patch: MutantPatch) -> None:
    original = tokens_module._check_fresh_positions

    def check(ids, stale):  # type: ignore[no-untyped-def]
        from tokenstate.contracts import get_checks_mode

        if get_checks_mode() == "full":
            original(ids, stale)

    patch.setattr(tokens_module, "_check_fresh_positions", check)


@mutant(
    "RCK-14/device-logits-indices-shape-only",
    doc="ForwardInput checks only the shape of its execution-device logits_indices.",
)
def device_logits_indices_shape_only(patch: MutantPatch) -> None:
    patch.setattr(forward_input_module, "_check_logits_in_step", lambda logits_indices, num_tokens: None)


@mutant(
    "RCK-15/host-reads-taken-as-fresh",
    doc="Every host-id read is taken as fresh (as if behind `inp.device_tokens is None`), so the "
    "checker passes forwards that break on the first spliced step.",
)
def host_reads_taken_as_fresh(patch: MutantPatch) -> None:
    def host_read(self, frame, kind, what, node):  # type: ignore[no-untyped-def]
        return self.origin(frame, "host_fresh", what, node)

    patch.setattr(Analyzer, "host_read", host_read)


@mutant(
    "RCK-16/external-base-answers-every-member",
    doc="A loaded external base (nn.Module) is taken to define every name asked of it, so a plain "
    "mixin listed after it is never reached: its host read passes as inert.",
)
def external_base_answers_every_member(patch: MutantPatch) -> None:
    patch.setattr(resolve_module, "_lacks_member", lambda klass, name: False)


@mutant(
    "RCK-17/bool-values-are-flags",
    doc="`a or b` / `a and b` with a device-ids test among the operands is read as a flag, not as the "
    "operand Python returns: `(inp.host_tokens or inp.device_tokens).ids` passes as inert.",
)
def bool_values_are_flags(patch: MutantPatch) -> None:
    def bool_op(self, frame, node):  # type: ignore[no-untyped-def]
        flag = self.flag_of(frame, node)
        return flag if flag is not None else join(*(self.eval(frame, v) for v in node.values))

    patch.setattr(Analyzer, "bool_op", bool_op)


@mutant(
    "RCK-18/match-cases-unguarded",
    doc="`match` cases run without the facts of their patterns and bind nothing: `case None:` is no "
    "freshness guard and a captured `device` is unresolved.",
)
def match_cases_unguarded(patch: MutantPatch) -> None:
    def match_block(self, frame, stmt):  # type: ignore[no-untyped-def]
        self.eval(frame, stmt.subject)
        base, states = frame.snapshot(), []
        for case in stmt.cases:
            frame.restore(base)
            if not self.exec_block(frame, case.body):
                states.append(frame.snapshot())
        frame.merge([base, *states])

    patch.setattr(Analyzer, "match_block", match_block)


@mutant(
    "RCK-19/external-methods-take-the-input-as-data",
    doc="A method the checker cannot read (an external base's, an external object's) handed the "
    "forward input is a tensor op on plain data: its result is inert.",
)
def external_methods_take_the_input_as_data(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "input_to_external_method", lambda self, *args: None)


@mutant(
    "RCK-20/handlers-and-managers-inherit-the-body-facts",
    doc="`try` and `with` as before: an `except` handler runs with whatever facts the body's last "
    "statement left (the fall-through of an early return inside the body), and a `with` body that "
    "returns ends the function whatever its manager swallows.",
)
def handlers_and_managers_inherit_the_body_facts(patch: MutantPatch) -> None:
    def try_block(self, frame, stmt):  # type: ignore[no-untyped-def]
        base = frame.snapshot()
        states = [] if self.exec_block(frame, stmt.body) else [frame.snapshot()]
        for handler in stmt.handlers:
            frame.merge([base, *states])
            if handler.name:
                frame.env[handler.name] = OPAQUE
            if not self.exec_block(frame, handler.body):
                states.append(frame.snapshot())
        frame.merge(states or [base])
        self.exec_block(frame, stmt.orelse)
        self.exec_block(frame, stmt.finalbody)
        return False

    patch.setattr(Analyzer, "try_block", try_block)
    patch.setattr(Analyzer, "may_swallow", lambda self, manager: False)


@mutant(
    "RCK-21/branch-facts-end-with-the-branch",
    doc="What a branch learnt ends with the branch: only a plain `if`/`else` whose one side ends "
    "hands the other side's guard on, so the fall-through of an early return inside an `elif` or a "
    "`match` case is lost.",
)
def branch_facts_end_with_the_branch(patch: MutantPatch) -> None:
    def branch(self, frame, test, body, orelse):  # type: ignore[no-untyped-def]
        when_true, when_false = self.guard(frame, test)
        base, states, ends = frame.snapshot(), [], []
        for block, facts in ((body, when_true), (orelse, when_false)):
            frame.restore(base)
            saved = self.with_facts(frame, facts)
            ends.append(self.exec_block(frame, block))
            frame.fresh, frame.narrow = saved
            if not ends[-1]:
                states.append(frame.snapshot())
        frame.merge(states or [base])
        if ends[0] != ends[1]:
            self.with_facts(frame, when_false if ends[0] else when_true)
        return all(ends)

    def match_block(self, frame, stmt):  # type: ignore[no-untyped-def]
        subject = self.eval(frame, stmt.subject)
        on_device = subject == Tokens("device")
        base, states = frame.snapshot(), []
        none_taken = device_taken = False
        for case in stmt.cases:
            frame.restore(base)
            kind = execute_module._device_pattern(case.pattern) if on_device else None
            fresh = kind == "none" or (kind is None and on_device and device_taken and not none_taken)
            saved = self.with_facts(frame, Facts(fresh, {}))
            for name in execute_module._captures(case.pattern):
                self.assign(frame, ast.Name(id=name, ctx=ast.Store()), subject)
            if case.guard is not None:
                self.eval(frame, case.guard)
            ends = self.exec_block(frame, case.body)
            frame.fresh, frame.narrow = saved
            if not ends:
                states.append(frame.snapshot())
            none_taken = none_taken or (kind == "none" and case.guard is None)
            device_taken = device_taken or (kind == "device" and case.guard is None)
        frame.merge([base, *states])

    patch.setattr(Analyzer, "branch", branch)
    patch.setattr(Analyzer, "match_block", match_block)


@mutant(
    "RCK-22/stored-values-stay-fresh",
    doc="Host ids or tokens taken under a freshness guard keep their freshness when stored on the "
    "model: a later call that reads the cached ids back outside any guard embeds them as fresh.",
)
def stored_values_stay_fresh(patch: MutantPatch) -> None:
    _store_as(patch, lambda value: value)


@mutant(
    "RCK-23/containers-filled-later-stay-empty",
    doc="A dict or list filled after it is built (item assignment, append, update...) keeps the "
    "value it was built with, and the input stored on an unmodelled object is dropped: the token "
    "values put into them are never read back, and the forward is inert.",
)
def containers_filled_later_stay_empty(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "_FILLS", frozenset())
    patch.setattr(execute_module, "with_item", lambda container, key, value: container)
    patch.setattr(Analyzer, "stored_out_of_sight", lambda self, frame, base, value, node: None)


@mutant(
    "RCK-24/star-args-get-no-input",
    doc="The entry point's forward input goes only to a named positional parameter: a pass-through "
    "`def forward(model, *args)` is analysed with empty `args`, and the model it calls never sees "
    "the input.",
)
def star_args_get_no_input(patch: MutantPatch) -> None:
    original = Analyzer.entry_arguments

    def entry_arguments(self, target, func, frame):  # type: ignore[no-untyped-def]
        node = func.info.node
        vararg, node.args.vararg = node.args.vararg, None
        try:
            return original(self, target, func, frame)
        finally:
            node.args.vararg = vararg

    patch.setattr(Analyzer, "entry_arguments", entry_arguments)


@mutant(
    "RCK-25/module-dict-attributes-opaque",
    doc="An nn.ModuleDict's entry reached by attribute (`self.transformer.wte`) is a method of the "
    "dict, not the sub-module, and `dict(wte=...)` forgets its keys: nanoGPT's embedding is never "
    "seen, and its forwards are inert.",
)
def module_dict_attributes_opaque(patch: MutantPatch) -> None:
    original = Analyzer.attribute

    def attribute(self, frame, base, name, node):  # type: ignore[no-untyped-def]
        if isinstance(base, MapV):
            return Bound(base, name)
        return original(self, frame, base, name, node)

    patch.setattr(Analyzer, "attribute", attribute)


@mutant(
    "RCK-26/loop-exits-fall-through",
    doc="`break` and `continue` are plain statements: the rest of the loop body after `if device "
    "ids: ...; continue` is analysed as if device ids were present, and a loop's facts outlive it.",
)
def loop_exits_fall_through(patch: MutantPatch) -> None:
    original = Analyzer.exec_stmt

    def exec_stmt(self, frame, stmt):  # type: ignore[no-untyped-def]
        if isinstance(stmt, ast.Break | ast.Continue):
            return False
        return original(self, frame, stmt)

    patch.setattr(Analyzer, "exec_stmt", exec_stmt)


@mutant(
    "RCK-27/in-place-writes-dropped",
    doc="Ids written into a tensor in place (`buf[:n] = ids`, `buf[:n].copy_(ids)`) are dropped: "
    "vLLM's persistent input buffer holds nothing, and a forward embedding it is inert.",
)
def in_place_writes_dropped(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "write_into", lambda self, frame, expr, value: None)


@mutant(
    "RCK-28/none-beside-device-tokens-dropped",
    doc="Plain data (a `None`) joined with the device tokens is dropped: `inp.device_tokens if switch "
    "else None` is the device tokens, and `is None` on it guards host reads that run with device ids.",
)
def none_beside_device_tokens_dropped(patch: MutantPatch) -> None:
    import tokenstate.checker.values as values_module

    patch.setattr(values_module, "_DEVICE_TOKENS", object())


@mutant(
    "RCK-29/analysed-decorators-assumed-identity",
    doc="Every decorator is assumed to return the function it wraps: a logging wrapper of the "
    "package that reads host ids, or one that swaps in a host forward, is never analysed.",
)
def analysed_decorators_assumed_identity(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "decorated", lambda self, frame, func, node: func)


@mutant(
    "RCK-30/class-decorators-and-hooks-unseen",
    doc="A class decorator assigning `cls.forward`, and a forward hook registered on a module, are "
    "ignored: the class's own forward is analysed, and the hook's host read is never seen.",
)
def class_decorators_and_hooks_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "class_patches", lambda self, cls: {})
    patch.setattr(Analyzer, "forward_hook", lambda self, frame, registration, hooks, node: None)


@mutant(
    "RCK-31/getattribute-is-a-method-call",
    doc="`x.__getattribute__(\"name\")` is an unknown method of plain data, not the attribute read it "
    "is: `inp.__getattribute__(\"host_tokens\").ids` reads nothing.",
)
def getattribute_is_a_method_call(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "spelt_attribute_read", lambda self, frame, node: None)


@mutant(
    "RCK-32/first-key-wins-and-slices-keep-all",
    doc="A dict lookup takes the first entry under a key (`{\"k\": guard, \"k\": True}` is the guard), "
    "and a slice of a tuple is the whole tuple (`flags[1:][0]` is `flags[0]`).",
)
def first_key_wins_and_slices_keep_all(patch: MutantPatch) -> None:
    def lookup(self, key):  # type: ignore[no-untyped-def]
        for known, value in self.items or ():
            if known == key and type(known) is type(key):
                return value
        return self.values

    patch.setattr(MapV, "lookup", lookup)
    patch.setattr(evaluate_module, "_sliced", lambda base, part: base)


@mutant(
    "RCK-33/match-binds-the-subject-only",
    doc="A `match` case binds only names for the whole subject: `case ForwardInput(host_tokens=h)` "
    "leaves `h` unbound (its reads unseen), and `case (None, host)` on a tuple guards nothing.",
)
def match_binds_the_subject_only(patch: MutantPatch) -> None:
    def pattern_captures(self, frame, pattern, subject):  # type: ignore[no-untyped-def]
        names = {}
        if isinstance(pattern, ast.MatchAs) and pattern.name is not None:
            names[pattern.name] = subject
        return names

    patch.setattr(Analyzer, "pattern_captures", pattern_captures)
    patch.setattr(execute_module, "_matches_none_device_tokens", lambda pattern, subject: False)


@mutant(
    "RCK-34/stale-row-tests-are-not-values",
    doc="`inp.has_stale_rows` and `host_tokens.has_stale` guard only where the `if` names them: kept in "
    "a local or returned by a helper and negated, they are plain data and the guarded read a finding.",
)
def stale_row_tests_are_not_values(patch: MutantPatch) -> None:
    import tokenstate.checker.guards as guards_module

    original_attribute, original_facts = Analyzer.attribute, guards_module.facts_of_value

    def attribute(self, frame, base, name, node):  # type: ignore[no-untyped-def]
        if name in ("has_stale_rows", "has_stale") and (base == Input() or isinstance(base, Tokens)):
            return Bound(base, name)
        return original_attribute(self, frame, base, name, node)

    def facts_of_value(value):  # type: ignore[no-untyped-def]
        if isinstance(value, Bound) and value.name in ("has_stale_rows", "has_stale"):
            return Facts(False, {}), Facts(True, {})
        return original_facts(value)

    patch.setattr(Analyzer, "attribute", attribute)
    patch.setattr(guards_module, "facts_of_value", facts_of_value)


@mutant(
    "RCK-35/stored-tests-keep-guarding",
    doc="A device-ids test stored on the model keeps guarding when read back: `self.host_fresh = not "
    "inp.has_stale_rows` on the first step guards host reads on every later, stale, step.",
)
def stored_tests_keep_guarding(patch: MutantPatch) -> None:
    from tokenstate.checker.values import Flag, stored_beyond_the_call as original

    _store_as(patch, lambda value: value if isinstance(value, Flag) else original(value))


@mutant(
    "RCK-36/decorators-evaluated-at-module-level-only",
    doc="Decorators are evaluated in the module's namespace only and must be functions: one defined "
    "in the forward or the class body, or a class used as a decorator, is dropped; a context "
    "manager used as one swallows the function.",
)
def decorators_evaluated_at_module_level_only(patch: MutantPatch) -> None:
    original = Analyzer.analysed_decorators

    def analysed_decorators(self, node, module, owner=None, frame=None):  # type: ignore[no-untyped-def]
        return tuple(
            (text, value) for text, value in original(self, node, module)
            if not isinstance(value, ClassRef | GenCM)
        )

    patch.setattr(Analyzer, "analysed_decorators", analysed_decorators)


@mutant(
    "RCK-37/class-patching-by-direct-assignment-only",
    doc="Only a class decorator's direct `cls.x = ...` counts as patching: one returning a subclass, "
    "one using a helper, a base's __init_subclass__ and a metaclass leave the class's own forward.",
)
def class_patching_by_direct_assignment_only(patch: MutantPatch) -> None:
    def class_patches(self, cls):  # type: ignore[no-untyped-def]
        found = {}
        for text, decorator in self.analysed_decorators(cls.node, cls.module):
            target = decorator.info.node if isinstance(decorator, Func) else None
            params = [*target.args.posonlyargs, *target.args.args] if isinstance(target, ast.FunctionDef) else []
            for node in ast.walk(target) if params else ():
                for t in node.targets if isinstance(node, ast.Assign) else ():
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == params[0].arg:
                        found.setdefault(t.attr, text)
        return found

    patch.setattr(Analyzer, "class_patches", class_patches)


@mutant(
    "RCK-38/descriptors-read-as-plain-attributes",
    doc="A class attribute holding a descriptor reads as the descriptor object itself, never as what "
    "its __get__ returns.",
)
def descriptors_read_as_plain_attributes(patch: MutantPatch) -> None:
    original = Analyzer.bind_member

    def bind_member(self, frame, member, receiver, node):  # type: ignore[no-untyped-def]
        return original(self, frame, member, OPAQUE, node) if isinstance(member, Instance) else original(self, frame, member, receiver, node)

    patch.setattr(Analyzer, "bind_member", bind_member)


@mutant(
    "RCK-39/single-dispatch-is-a-plain-decorator",
    doc="functools.singledispatch is assumed to return the function it wraps: the base "
    "implementation is analysed, the registered ones never.",
)
def single_dispatch_is_a_plain_decorator(patch: MutantPatch) -> None:
    original = Analyzer.opaque_wrapper

    def opaque_wrapper(self, func):  # type: ignore[no-untyped-def]
        found = original(self, func)
        return None if found is not None and "singledispatch" in found else found

    patch.setattr(Analyzer, "opaque_wrapper", opaque_wrapper)


@mutant(
    "RCK-40/only-suppress-swallows",
    doc="Only contextlib.suppress itself swallows: an ExitStack it was entered on, a subclass of it "
    "and a @contextmanager yielding inside it are taken to swallow nothing.",
)
def only_suppress_swallows(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "SWALLOWING_MANAGERS", frozenset({"contextlib.suppress"}))

    def yield_in_handled_try(func):  # type: ignore[no-untyped-def]
        return any(
            isinstance(node, ast.Try | ast.TryStar) and node.handlers
            and any(isinstance(inner, ast.Yield | ast.YieldFrom) for stmt in node.body for inner in ast.walk(stmt))
            for node in ast.walk(func)
        )

    patch.setattr(calls_module, "_yield_in_handled_try", yield_in_handled_try)


@mutant(
    "RCK-41/concatenated-lists-lose-their-elements",
    doc="`[a] + [b]` and `[a] * n` are plain data derived from their operands: vLLM's make_layers "
    "list of layers holds nothing the checker can call.",
)
def concatenated_lists_lose_their_elements(patch: MutantPatch) -> None:
    original = Analyzer.eval

    def eval_(self, frame, node):  # type: ignore[no-untyped-def]
        if isinstance(node, ast.BinOp):
            return join(taint(original(self, frame, node.left)), taint(original(self, frame, node.right)))
        return original(self, frame, node)

    patch.setattr(Analyzer, "eval", eval_)


@mutant(
    "RCK-42/replaced-init-followed-and-constants-unread",
    doc="A class whose __init__ a class decorator replaced is built as if it had none (its model "
    "analysed with no attributes), and setattr(cls, KEY, ...) with a module constant may assign any member.",
)
def replaced_init_followed_and_constants_unread(patch: MutantPatch) -> None:
    original = Analyzer.instantiate

    def instantiate(self, frame, cls, args, kwargs, node):  # type: ignore[no-untyped-def]
        member = self.class_member(cls, "__init__")
        if member is not None and isinstance(member[0], Unknown):
            return Instance(cls, ())
        return original(self, frame, cls, args, kwargs, node)

    patch.setattr(Analyzer, "instantiate", instantiate)
    patch.setattr(Analyzer, "module_constant", lambda self, module, name: None)


@mutant(
    "RCK-43/any-published-scope-makes-unresolved-calls-unknown",
    doc="Any unresolved call made while some scope is published is an unknown route, even when the "
    "scope holds no ids (a forward context of metadata around a cached rotary module).",
)
def any_published_scope_makes_unresolved_calls_unknown(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "scope_carries_tokens", lambda self, frame: bool(frame.published))


@mutant(
    "RCK-44/local-names-are-never-fixed",
    doc="A local name is never a fixed constant: getattr(self.config, name) in a loop over a literal "
    "list of names, and getattr(self, name) after name = getattr(self, CONST_ATTR, default), are "
    "dynamic dispatch (unknown), and kwargs[name] = v spreads v into every parameter.",
)
def local_names_are_never_fixed(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "local_choices", lambda self, frame, name: None)


@mutant(
    "RCK-45/registries-indexed-as-data",
    doc="obj[key] on an object whose class defines __getitem__ is plain data derived from obj: the "
    "mask function a registry returns cannot be called.",
)
def registries_indexed_as_data(patch: MutantPatch) -> None:
    original = Analyzer.subscript

    def subscript(self, frame, base, node):  # type: ignore[no-untyped-def]
        return OPAQUE if isinstance(base, Instance) else original(self, frame, base, node)

    patch.setattr(Analyzer, "subscript", subscript)


@mutant(
    "RCK-46/every-forward-hook-is-unknown",
    doc="Every forward hook makes the forward unknown, even a plain function that captures nothing "
    "and touches no ids (transformers' requires_grad_ hook on the input embedding).",
)
def every_forward_hook_is_unknown(patch: MutantPatch) -> None:
    from tokenstate.checker.calls import FORWARD_HOOK
    from tokenstate.checker.frame import Event

    def forward_hook(self, frame, registration, hooks, node):  # type: ignore[no-untyped-def]
        hook = self.unknown(frame, f"registers a forward hook ({registration})", node)
        frame.add_event(Event("unresolved", hook, FORWARD_HOOK, (frame.hop(getattr(node, "lineno", 0)),)))

    patch.setattr(Analyzer, "forward_hook", forward_hook)


@mutant(
    "RCK-47/one-level-of-star-imports",
    doc="A name is looked up one `from x import *` deep: `from transformers import LlamaForCausalLM` "
    "(three levels of star imports) leaves the model's class unknown.",
)
def one_level_of_star_imports(patch: MutantPatch) -> None:
    def star_provides(self, module, name, seen):  # type: ignore[no-untyped-def]
        info = self.load_module(module) if self.config.is_analysed(module) else None
        return info is not None and not isinstance(info, Unknown) and name in info.bindings

    patch.setattr(Analyzer, "_star_provides", star_provides)


@mutant(
    "RCK-48/code-handed-out-reaches-nothing",
    doc="Analysed code handed to a thread pool or a thread reaches only what it is handed: a job "
    "closing over the forward input (`pool.submit(lambda: embed(inp.host_tokens.ids))`) is dropped.",
)
def code_handed_out_reaches_nothing(patch: MutantPatch) -> None:
    patch.setattr(externals_module, "code_reaches_tokens", lambda code, *, ids=True: False)


@mutant(
    "RCK-49/forward-hooks-tried-without-the-input",
    doc="A forward hook is tried with opaque arguments only, so a pre-hook reading the step's input "
    "from the module call's args (`args[0].host_tokens.ids`) looks plain and is left out.",
)
def forward_hooks_tried_without_the_input(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "hook_arguments", lambda arity: (OPAQUE,) * arity)


@mutant(
    "RCK-50/build-assignments-and-method-type-unseen",
    doc="What `build` assigns on the model after making it is dropped, and `types.MethodType(f, "
    "model)` is plain data: a host reader bound by hand in `build` is never analysed.",
)
def build_assignments_and_method_type_unseen(patch: MutantPatch) -> None:
    def built_model(self, frame, target):  # type: ignore[no-untyped-def]
        if not (target.model_module and target.model_qualname):
            return None
        build = self.resolve_global(target.model_module, target.model_qualname)
        if not isinstance(build, Func):
            return None
        built = self.invoke(frame, build, (), (), ast.Pass()).ret  # the instance as constructed
        options = getattr(built, "options", (built,))
        return built if all(isinstance(o, Instance) for o in options) else None

    patch.setattr(Analyzer, "built_model", built_model)


@mutant(
    "RCK-51/module-level-class-patches-unseen",
    doc="`Class.name = value` at module level, after the class body, is not seen: the body's method "
    "is analysed instead of the host reader that replaced it.",
)
def module_level_class_patches_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "patched_after_body", lambda self, cls: {})


@mutant(
    "RCK-52/stale-rows-tuple-is-data",
    doc="`inp.host_tokens.stale_rows` is plain data: `ids = host.ids if not host.stale_rows else "
    "device.ids` reads host ids unguarded, although an empty tuple means every host id is fresh.",
)
def stale_rows_tuple_is_data(patch: MutantPatch) -> None:
    patch.setattr(evaluate_module, "STALE_TESTS", frozenset({"has_stale"}))


@mutant(
    "RCK-53/state-kept-for-the-next-step-unseen",
    doc="Each forward call is analysed with the model as constructed: host tokens or the whole input "
    "kept on the model in one step (`model.previous = inp.host_tokens`) and read in the next are "
    "never seen.",
)
def state_kept_for_the_next_step_unseen(patch: MutantPatch) -> None:
    import tokenstate.checker.engine as engine_module

    patch.setattr(engine_module, "_with_kept_state", lambda value, kept, depth=0: value)


@mutant(
    "RCK-54/code-given-as-text-is-data",
    doc="`eval`/`exec` are plain builtins: `eval(\"inp.host_tokens.ids\")` reads nothing, so the "
    "forward is `inert`.",
)
def code_given_as_text_is_data(patch: MutantPatch) -> None:
    patch.setattr(externals_module, "_TEXT_RUNNERS", frozenset())


@mutant(
    "RCK-55/raised-tokens-dropped",
    doc="An `except ... as e` handler binds plain data, whatever the `try` body raised: "
    "`raise Carry(inp.host_tokens)` then `e.args[0].ids` reads nothing (the forward is `inert`).",
)
def raised_tokens_dropped(patch: MutantPatch) -> None:
    original = Analyzer.exec_stmt

    def exec_stmt(self, frame, stmt):  # type: ignore[no-untyped-def]
        if isinstance(stmt, ast.Raise):
            if stmt.exc is not None:
                self.eval(frame, stmt.exc)
            return True
        return original(self, frame, stmt)

    patch.setattr(Analyzer, "exec_stmt", exec_stmt)


@mutant(
    "RCK-56/tokens-sent-into-generators-dropped",
    doc="`gen.send(inp.host_tokens)` is a method of plain data: what the generator does with the "
    "tokens is never reported (the forward is `inert`).",
)
def tokens_sent_into_generators_dropped(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "GENERATOR_INPUTS", frozenset())


@mutant(
    "RCK-57/eafp-and-getattr-defaults-guard-nothing",
    doc="`try: ids = inp.device_tokens.ids` / `except AttributeError:` and `getattr(inp.device_tokens, "
    "\"ids\", None) is None` guard nothing: the host read that runs exactly when there are no device "
    "ids is a finding.",
)
def eafp_and_getattr_defaults_guard_nothing(patch: MutantPatch) -> None:
    import tokenstate.checker.guards as guards_module

    patch.setattr(Analyzer, "raises_only_without_device_ids", lambda self, frame, body: False)
    patch.setattr(guards_module, "NONE_WITHOUT_DEVICE_IDS", object())


def _store_as(patch: MutantPatch, stored: object) -> None:
    """Every place a value stored beyond the call is turned into what a later call reads back:
    a call's writes on its receiver and on other objects as its summary hands them out, and a path
    that did not write an attribute or a cell."""
    import tokenstate.checker.engine as engine_module
    import tokenstate.checker.frame as frame_module

    for module in (engine_module, frame_module):
        patch.setattr(module, "stored_beyond_the_call", stored)


@mutant(
    "RCK-58/state-dumps-read-nothing",
    doc="`inp.host_tokens.__getstate__()` (or `__reduce_ex__`) is a plain method: the slots' state it "
    "hands out, the raw buffer among it, reads nothing (the forward is `inert`).",
)
def state_dumps_read_nothing(patch: MutantPatch) -> None:
    patch.setattr(evaluate_module, "STATE_DUMPS", frozenset())
    patch.setattr(calls_module, "STATE_DUMPS", frozenset())


@mutant(
    "RCK-59/hook-containers-stay-as-built",
    doc="A forward hook's closure is tried as it was when the hook was registered: a dict it closes "
    "over is empty then, so a hook reading the host tokens the forward later puts there looks plain.",
)
def hook_containers_stay_as_built(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "_filled_by_the_forward", lambda hook: hook)


@mutant(
    "RCK-60/thread-jobs-called-out-of-sight",
    doc="A job handed to a thread runner with the input among its arguments (`pool.submit(fn, inp)`) "
    "is code run out of sight: every such job is `unknown`, whatever it reads.",
)
def thread_jobs_called_out_of_sight(patch: MutantPatch) -> None:
    patch.setattr(externals_module, "thread_job_call", lambda runner, args, kwargs: None)


@mutant(
    "RCK-61/hook-trials-count-only-reads",
    doc="A forward hook's trial counts only host reads and embeddings: one that hands the host tokens "
    "to code out of sight (`gc.get_referents(tokens)`, which reaches the raw buffer) looks plain.",
)
def hook_trials_count_only_reads(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "_only_stores", lambda trial: not any(e.kind == "sink" for e in trial))


@mutant(
    "RCK-62/module-and-class-state-read-as-defined",
    doc="A module-level tensor filled in place is a local of the call, and a class attribute written "
    "from outside its class (`Holder.ids = ...`) is read as the class defines it: a buffer filled "
    "with host ids on fresh steps only, then embedded on every step, looks fresh or inert.",
)
def module_and_class_state_read_as_defined(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "filled_variable", lambda self, frame, expr: None)
    patch.setattr(Analyzer, "kept_on_the_class", lambda self, frame, info, name: None)


@mutant(
    "RCK-63/rows-and-replaced-inputs-unseen",
    doc="`r in inp.host_tokens.stale_rows` says nothing of row r, so `row_ids(r)` on its false side is "
    "a stale read; `dataclasses.replace(inp, positions=...)` hands the input to code out of sight.",
)
def rows_and_replaced_inputs_unseen(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "fresh_row_fact", lambda row: "no fact is kept for a row")
    patch.setattr(externals_module, "_REPLACES", frozenset())


@mutant(
    "RCK-64/writes-handed-out-stale",
    doc="What a method assigns on its receiver or on other objects goes stale as its summary hands it "
    "to the caller: ids a method stages on every path for the forward to read in the same call look "
    "like an earlier call's.",
)
def writes_handed_out_stale(patch: MutantPatch) -> None:
    from tokenstate.checker.values import stored_beyond_the_call

    original = Analyzer.analyse

    def analyse(self, func, args, kwargs, published, fresh, depth):  # type: ignore[no-untyped-def]
        summary = original(self, func, args, kwargs, published, fresh, depth)
        if getattr(func.info.node, "name", "") in ("__init__", "__new__", "__post_init__"):
            return summary
        return dataclasses.replace(
            summary,
            self_writes=tuple((k, stored_beyond_the_call(v)) for k, v in summary.self_writes),
            obj_writes=tuple((i, tuple((k, stored_beyond_the_call(v)) for k, v in w)) for i, w in summary.obj_writes),
        )

    patch.setattr(Analyzer, "analyse", analyse)


@mutant(
    "RCK-65/fills-seen-by-name-only",
    doc="A fill in place is seen only as `name[...] = ids` or `name[...].copy_(ids)`: through a "
    "helper's parameter, a local alias, a view method, `index_copy_`, a module-level list item or "
    "`module.NAME`, the filled object keeps what it held.",
)
def fills_seen_by_name_only(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "fill_in_place", lambda self, frame, expr, value, *, tensor=False: self.assign(frame, expr, value))
    patch.setattr(calls_module, "IN_PLACE_WRITES", frozenset({"copy_"}))
    patch.setattr(calls_module, "_argument_given", lambda func, node, param: None)


@mutant(
    "RCK-66/views-are-separate-values",
    doc="A view of a tensor's memory is a value of its own: ids written through `t.numpy()`, "
    "`np.asarray(t)` or an attribute bound to a view (`self.ids_np = self.ids.numpy()`) leave the "
    "tensor as it was, and ids written into the tensor leave its views as they were.",
)
def views_are_separate_values(patch: MutantPatch) -> None:
    tensor_views = {"narrow", "view", "view_as", "reshape", "select", "flatten", "squeeze", "unsqueeze", "__getitem__"}

    def viewed(expr):  # type: ignore[no-untyped-def]
        while isinstance(expr, ast.Subscript) or (
            isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in tensor_views
        ):
            expr = expr.value if isinstance(expr, ast.Subscript) else expr.func.value
        return expr

    patch.setattr(execute_module, "viewed", viewed)
    patch.setattr(Analyzer, "sharing_attributes", lambda self, cls: {})
    patch.setattr(Analyzer, "sharing_globals", lambda self, module: {})


@mutant(
    "RCK-67/names-spelt-at-run-time-unseen",
    doc="`globals()[\"NAME\"] = v`, `obj.__dict__[\"name\"] = v`, `vars(obj)[\"name\"] = v`, "
    "`module._modules[\"name\"] = m`, `module.register_buffer(\"name\", t)` and "
    "`module.add_module(\"name\", m)` are item writes and calls like any other: the global or "
    "attribute they assign keeps what it held.",
)
def names_spelt_at_run_time_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "assignment_spelt", lambda self, frame, target: None)
    patch.setattr(calls_module, "NAMED_SETTERS", frozenset())


@mutant(
    "RCK-68/closures-defaults-and-caches-forget",
    doc="A closure's `nonlocal` variable, a mutable default argument and the object an `lru_cache` "
    "factory hands out start every call as they were built: what an earlier call left in them is not "
    "seen.",
)
def closures_defaults_and_caches_forget(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "closure_cell", lambda frame, name: None)
    patch.setattr(evaluate_module, "closure_cell", lambda frame, name: None)
    patch.setattr(engine_module, "_builds_a_shared_default", lambda default: False)
    patch.setattr(execute_module, "RESULT_CACHES", frozenset())


@mutant(
    "RCK-69/engine-spellings-of-shared-memory-unseen",
    doc="Only the first spellings of shared and kept memory are seen: a view of a nested attribute "
    "(`self.ids_np = self.buf.cpu.numpy()`), `ravel()`, `np.copyto` / `np.put`, `globals()[\"K\"][:n] = ...`, "
    "a closure's captured tensor filled in place and a default tensor filled in place leave what they "
    "fill as it was.",
)
def engine_spellings_of_shared_memory_unseen(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_NESTING", 1)
    patch.setattr(
        views_module, "_path",
        lambda expr, receiver: expr.attr if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name)
        and expr.value.id == receiver else None,
    )
    patch.setattr(views_module, "VIEWS", views_module.VIEWS - {"ravel", "swapaxes"})
    patch.setattr(views_module, "ATTRIBUTE_VIEWS", frozenset())
    patch.setattr(views_module, "global_item", lambda expr: None)
    patch.setattr(
        execute_module, "shared_globals",
        lambda module: views_module._groups([
            (t.id, source.id) for stmt in module.body if isinstance(stmt, ast.Assign) for t in stmt.targets
            if isinstance(t, ast.Name) and isinstance(source := views_module.viewed(stmt.value), ast.Name) and source.id != t.id
        ]),
    )
    patch.setattr(calls_module, "WRITING_FUNCTIONS", frozenset())
    patch.setattr(Analyzer, "captured_cell", lambda self, frame, expr: None)
    patch.setattr(
        engine_module, "_builds_a_shared_default",
        lambda default: isinstance(default, ast.List | ast.Dict | ast.Set) or (
            isinstance(default, ast.Call) and isinstance(default.func, ast.Name) and default.func.id in ("list", "dict", "set")
        ),
    )


@mutant(
    "RCK-70/methods-see-the-objects-as-built",
    doc="A method reads the objects its receiver holds as they were built, not as its caller staged "
    "them; `copy_` returns nothing the checker follows; a side of a guard that needs device ids is "
    "analysed under a caller that has none; what a method writes before an early `return` is lost.",
)
def methods_see_the_objects_as_built(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "_NESTING", 0)
    patch.setattr(Analyzer, "filled_result", lambda self, frame, target: OPAQUE)
    patch.setattr(execute_module, "never_taken", lambda fresh, side: False)
    patch.setattr(evaluate_module, "never_taken", lambda fresh, side: False)
    patch.setattr(Frame, "join_exits", lambda self, states: None)


@mutant(
    "RCK-71/module-objects-written-out-of-sight",
    doc="A write through a module object (`state.K = v`, `setattr(state, \"K\", v)`, `vars(state)[\"K\"] = v`, "
    "`sys.modules[__name__].__dict__[\"K\"] = v`) is dropped: the global keeps what its module binds.",
)
def module_objects_written_out_of_sight(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "write_module_global", lambda self, frame, module, name, value: None)


@mutant(
    "RCK-72/records-built-from-their-own-annotations",
    doc="A dataclass binds its arguments to the fields its own body annotates: inherited fields, "
    "`InitVar`s and `__post_init__` are not seen, and a `typing.NamedTuple` holds nothing.",
)
def records_built_from_their_own_annotations(patch: MutantPatch) -> None:
    def own_annotations(self, cls):
        if "dataclass" not in decorator_names(cls.node):
            return None
        return [RecordField(s.target.id, True, True, False) for s in cls.node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]

    patch.setattr(Analyzer, "record_fields", own_annotations)
    patch.setattr(Analyzer, "class_member", _without_post_init(Analyzer.class_member))
    patch.setattr(Analyzer, "record_items", lambda self, value: None)


def _without_post_init(class_member):
    def member(self, cls, name, after=None):
        return None if name == "__post_init__" else class_member(self, cls, name, after)
    return member


@mutant(
    "RCK-73/patches-from-other-modules-unseen",
    doc="A class member replaced at the top level of another module the package imports "
    "(`modeling.Model.token_ids = fast_token_ids` in `patches.py`) is not seen: the body's member is used.",
)
def patches_from_other_modules_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "patched_by_other_modules", lambda self, cls: {})


@mutant(
    "RCK-74/replacement-passes-unseen",
    doc="A `setattr(module, name, wrapper)` with a computed name changes nothing the checker sees: "
    "the submodules a module-replacement pass (`model.apply(fn)`) swaps keep their `__init__` values.",
)
def replacement_passes_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "replace_some_submodule", lambda self, frame, target, owner, value, name=None: None)


@mutant(
    "RCK-75/lazy-buffers-written-by-every-call",
    doc="A buffer created under `not hasattr(self, ...)` / `is None` counts as written by every call: "
    "a later call's path that skips the fill reads the fresh creation, not what earlier calls left.",
)
def lazy_buffers_written_by_every_call(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_created_when_unset", lambda test, receiver: None)


@mutant(
    "RCK-76/ids-kept-start-the-next-call-unseen",
    doc="A method is analysed once, with its receiver as built: host ids it left unwritten on a path "
    "are not there when its next call reads them before writing.",
)
def ids_kept_start_the_next_call_unseen(patch: MutantPatch) -> None:
    patch.setattr(engine_module, "_possibly_stale_ids", lambda value: OPAQUE)


@mutant(
    "RCK-77/new-taken-to-build-its-class",
    doc="Every analysed `__new__` is taken to build the class called: a layer whose `__new__` picks a "
    "registered replacement is analysed as the class called.",
)
def new_taken_to_build_its_class(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "_builds_its_own_class", lambda new: True)


@mutant(
    "RCK-78/custom-ops-are-plain-kernels",
    doc="Every `torch.ops` call is a kernel of torch's own: a custom op whose registered Python "
    "implementation reads ids the forward kept in a module-level buffer is inert.",
)
def custom_ops_are_plain_kernels(patch: MutantPatch) -> None:
    patch.setattr(externals_module, "_KERNEL_NAMESPACES", _EVERY_NAMESPACE)


class _EveryNamespace(frozenset):
    def __contains__(self, item: object) -> bool:
        return True


_EVERY_NAMESPACE = _EveryNamespace()


@mutant(
    "RCK-79/stale-mask-is-data",
    doc="`inp.host_tokens.stale` is a tensor like any other: its `any()` is no test of freshness.",
)
def stale_mask_is_data(patch: MutantPatch) -> None:
    patch.setattr(evaluate_module, "MASK_TESTS", frozenset())
    patch.setattr(externals_module, "STALE_MASK", Bound(Tokens("host"), "a tensor"))


@mutant(
    "RCK-80/patches-seen-before-they-run",
    doc="A module-level statement sees the class members its module patches later: "
    "`_original = Model.ids_for` before `Model.ids_for = wrapping` keeps the wrapper, which then calls itself.",
)
def patches_seen_before_they_run(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "at_statement", lambda self, module, line: contextlib.nullcontext())


@mutant(
    "RCK-81/loop-patches-unseen",
    doc="A patch made in a top-level loop over classes (`for cls in (A, B): cls.ids_for = ...`) is "
    "not seen: the body's member is used.",
)
def loop_patches_unseen(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_loop_bindings", lambda target, item: None)


@mutant(
    "RCK-82/named-tuples-iterated-as-opaque-objects",
    doc="Iterating over a `typing.NamedTuple` (`for part in meta`, `list(meta)`, `f(*meta)`) gives "
    "what iterating any object gives, not its fields.",
)
def named_tuples_iterated_as_opaque_objects(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "as_iterated", lambda self, value: value)


@mutant(
    "RCK-83/flag-guarded-creations-written-by-every-call",
    doc="Only the attribute a not-yet-set test names is created once: a buffer allocated in the same "
    "block as the flag it sets (`if not getattr(self, \"_ready\", False):`) counts as written by every call.",
)
def flag_guarded_creations_written_by_every_call(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_assigned_since", lambda before, after: set())


@mutant(
    "RCK-84/submodule-walks-opaque",
    doc="`model.named_modules()` / `modules()` / `children()` give opaque objects: a replacement pass "
    "walking them in `build` swaps nothing the checker sees.",
)
def submodule_walks_opaque(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "submodules", lambda self, frame, model, walk: Seq(None, OPAQUE))


@mutant(
    "RCK-86/submodule-paths-opaque",
    doc="`model.get_submodule(path)` gives an opaque object and `model.set_submodule(path, m)` changes "
    "nothing the checker sees.",
)
def submodule_paths_opaque(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "submodule_at", lambda self, frame, model, method, node, args: OPAQUE)


@mutant(
    "RCK-87/record-methods-opaque",
    doc="A NamedTuple's `_asdict()` and `_replace(...)` give what an external method gives: nothing of its fields.",
)
def record_methods_opaque(patch: MutantPatch) -> None:
    patch.setattr(calls_module, "RECORD_METHODS", frozenset())
    patch.setattr(evaluate_module, "RECORD_METHODS", frozenset())


@mutant(
    "RCK-88/first-step-blocks-run-every-call",
    doc="A block behind `if self._step == 0:` counts as run on every call: a buffer it creates is taken "
    "as written by each call, not as what earlier calls left.",
)
def first_step_blocks_run_every_call(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_counters", lambda func, receiver: set())


@mutant(
    "RCK-89/module-table-writes-by-a-computed-name-lost",
    doc="`module._modules[name] = Wrapper()` with a computed name replaces nothing: the submodule "
    "it names keeps what it held.",
)
def module_table_writes_by_a_computed_name_lost(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "replaced_by_a_computed_name", lambda self, frame, target, owner, name, value: False)


@mutant(
    "RCK-90/patching-calls-at-import-unfollowed",
    doc="A call of the module's own function at its top level (`apply_patches()`) patches nothing: "
    "the class keeps the member its body defines.",
)
def patching_calls_at_import_unfollowed(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_called_function", lambda call, info, calling: None)


@mutant(
    "RCK-91/emptiness-tests-not-once-only",
    doc="A block behind `if self.staged.numel() == 0:` counts as run on every call: the buffer it "
    "allocates is taken as written by each call, not as what earlier calls left.",
)
def emptiness_tests_not_once_only(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_sized", lambda node, receiver: None)


@mutant(
    "RCK-92/dicts-of-pairs-opaque",
    doc="`dict(pairs)` (`dict(zip(meta._fields, meta))`) holds nothing of the pairs' values.",
)
def dicts_of_pairs_opaque(patch: MutantPatch) -> None:
    patch.setattr(externals_module, "_dict_values", lambda source: source.values if isinstance(source, MapV) else OPAQUE)


@mutant(
    "RCK-93/replacement-filters-ignored",
    doc="A replacement pass's `setattr(module, name, w)` may replace any submodule sharing a class with "
    "`w`: the pass's own filter on the child the walk paired with `name` is not applied.",
)
def replacement_filters_ignored(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_names_a_submodule", lambda targets, parts: False)


@mutant(
    "RCK-94/exact-type-tests-as-isinstance",
    doc="`type(child) is K` narrows `child` as `isinstance(child, K)` does: instances of K's subclasses "
    "are taken to pass it too.",
)
def exact_type_tests_as_isinstance(patch: MutantPatch) -> None:
    original = Analyzer.isinstance_facts
    patch.setattr(Analyzer, "isinstance_facts", lambda self, frame, subject, classes, *, exact=False: original(self, frame, subject, classes))


@mutant(
    "RCK-95/once-only-flags-in-few-spellings",
    doc="Only `not self._ready` and `not getattr(self, \"_ready\", False)` mark a block run once: "
    "`is False`, `== False`, `is not True`, `self.__dict__.get(...)`, a part of an `and`, and the "
    "`else` of a test that the flag is set count as run on every call.",
)
def once_only_flags_in_few_spellings(patch: MutantPatch) -> None:
    original = execute_module._created_when_unset

    def fewer(test: ast.expr, receiver: str | None) -> str | None:
        if not hasattr(test, "lineno"):  # the `else` of `if self._ready:`, asked as `not <test>`
            return None
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return None
        if isinstance(test, ast.Compare) and any(isinstance(c, ast.Constant) and isinstance(c.value, bool) for c in test.comparators):
            return None
        if any(isinstance(n, ast.Attribute) and n.attr == "get" for n in ast.walk(test)):
            return None
        return original(test, receiver)

    patch.setattr(execute_module, "_created_when_unset", fewer)


@mutant(
    "RCK-96/early-returns-once-set-run-every-call",
    doc="`if self._ready: return` followed by the allocation counts as an ordinary branch: what follows "
    "it is taken as written by every call.",
)
def early_returns_once_set_run_every_call(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "unless_set", lambda self, stmt, rest, receiver: None)


@mutant(
    "RCK-97/patch-statement-shapes-unseen",
    doc="Only a plain `Model.f = g` (or `setattr`) at the top level patches: a comprehension run for its "
    "effects and a tuple assignment patch nothing.",
)
def patch_statement_shapes_unseen(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_comprehension_loop", lambda value: None)
    patch.setattr(patches_module, "_unpacked", lambda target, value: [])


@mutant(
    "RCK-98/dict-patch-loops-unseen",
    doc="A loop over a dict of patches (`for cls, fn in PATCHES.items()`) patches nothing.",
)
def dict_patch_loops_unseen(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_dict_items", lambda items, info: items)


@mutant(
    "RCK-99/patches-in-loop-tests-unseen",
    doc="A patch inside an `if` of a patching loop's body is not seen, whatever the test.",
)
def patches_in_loop_tests_unseen(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_statements_run", lambda body, info: [s for s in body if not isinstance(s, ast.If)])


@mutant(
    "RCK-100/forwards-set-on-instances-unseen",
    doc="Calling a module runs its class's `forward`, whatever `module.forward = fn` put on the instance.",
)
def forwards_set_on_instances_unseen(patch: MutantPatch) -> None:
    patch.setattr(Analyzer, "rebound_forward", lambda self, frame, inst: None)


@mutant(
    "RCK-101/deleted-members-kept",
    doc="`del Model.ids_for` (or `delattr`) at the top level removes nothing: the class's own member stays.",
)
def deleted_members_kept(patch: MutantPatch) -> None:
    patch.setattr(patches_module, "_deletions", lambda stmt: [])


@mutant(
    "RCK-102/walrus-buffers-unseen",
    doc="`(buf := getattr(self, \"staged\", None)) is None` is no once-only test, and `buf = self.staged = "
    "torch.zeros(...)` leaves `buf` a separate object: the buffer created and filled through `buf` is lost.",
)
def walrus_buffers_unseen(patch: MutantPatch) -> None:
    patch.setattr(execute_module, "_unwalrused", lambda expr: expr)
    patch.setattr(execute_module, "_chained_with", lambda stmt, target: None)


@mutant(
    "RCK-103/buffers-fetched-by-name-are-copies",
    doc="`buf = getattr(self, \"staged\")` leaves `buf` a separate object: what is filled into it does not "
    "reach `self.staged`.",
)
def buffers_fetched_by_name_are_copies(patch: MutantPatch) -> None:
    patch.setattr(views_module, "fetched_attribute", lambda expr: None)
