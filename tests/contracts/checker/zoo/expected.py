"""The zoo's entry points and their expected verdicts — plain data, read by the tests and the benchmark.

Keys are (module, forward); values are (expected verdict, the routing pattern the case exercises).
"""

EXPECTED: dict[tuple[str, str], tuple[str, str]] = {
    ("czoo.direct", "device_direct"): ("honors", "direct read"),
    ("czoo.direct", "embedding_ids_local"): ("honors", "locals"),
    ("czoo.direct", "host_direct"): ("ignores", "direct read"),
    ("czoo.direct", "host_rows"): ("ignores", "row_ids in a comprehension"),
    ("czoo.direct", "placeholder_buffer"): ("ignores", "raw host buffer"),
    ("czoo.direct", "guarded_fallback"): ("honors", "device-ids guard"),
    ("czoo.direct", "early_return_guard"): ("honors", "device-ids guard"),
    ("czoo.direct", "fresh_when_no_stale_rows"): ("honors", "stale-rows guard"),
    ("czoo.direct", "inverted_guard"): ("ignores", "device-ids guard"),
    ("czoo.direct", "torch_embedding_device"): ("honors", "nn.Embedding sink"),
    ("czoo.direct", "index_gather_host"): ("ignores", "weight[ids] sink"),
    ("czoo.direct", "functional_host"): ("ignores", "F.embedding sink"),
    ("czoo.comment_lies", "mentions_device_tokens"): ("ignores", "a comment mentions the field"),
    ("czoo.calls", "via_helper"): ("honors", "direct calls"),
    ("czoo.calls", "via_host_helper"): ("ignores", "direct calls"),
    ("czoo.hierarchy", "inherited"): ("honors", "methods through the hierarchy"),
    ("czoo.hierarchy", "overridden_to_host"): ("ignores", "methods through the hierarchy"),
    ("czoo.hierarchy", "through_super"): ("honors", "super()"),
    ("czoo.hierarchy", "nested_attribute"): ("honors", "attributes holding sub-modules"),
    ("czoo.hierarchy", "nested_attribute_host"): ("ignores", "attributes holding sub-modules"),
    ("czoo.aliases", "module_alias"): ("honors", "module aliases"),
    ("czoo.aliases", "reexport_host"): ("ignores", "re-exports"),
    ("czoo.aliases", "class_alias_honors"): ("honors", "class aliases"),
    ("czoo.aliases", "class_alias_host"): ("ignores", "class aliases"),
    ("czoo.partials", "partial_sink"): ("honors", "functools.partial"),
    ("czoo.partials", "partial_source_device"): ("honors", "functools.partial"),
    ("czoo.partials", "partial_source_host"): ("ignores", "functools.partial"),
    ("czoo.scoped_models", "contextvar_scope"): ("honors", "scope (ContextVar)"),
    ("czoo.scoped_models", "contextvar_scope_host"): ("ignores", "scope (ContextVar)"),
    ("czoo.scoped_models", "no_scope_opened"): ("unknown", "scope (ContextVar)"),
    ("czoo.scoped_models", "generator_scope"): ("honors", "scope (@contextmanager + global)"),
    ("czoo.scoped_models", "generator_scope_host"): ("ignores", "scope (@contextmanager + global)"),
    ("czoo.scoped_models", "thread_local_scope"): ("honors", "scope (threading.local)"),
    ("czoo.scoped_models", "class_attribute_scope"): ("honors", "scope (class attribute)"),
    ("czoo.scoped_models", "class_attribute_scope_raw"): ("ignores", "scope (class attribute)"),
    ("czoo.llama_like", "llama_forward"): ("honors", "shared dense block + class alias"),
    ("czoo.llama_like", "mistral_forward"): ("ignores", "shared dense block"),
    ("czoo.llama_like", "unannotated_with_build"): ("honors", "model class from the build function"),
    ("czoo.inert", "position_pooling"): ("inert", "pooling"),
    ("czoo.inert", "counts_tokens_only"): ("inert", "metadata only"),
    ("czoo.dynamic", "getattr_dispatch"): ("unknown", "dynamic dispatch"),
    ("czoo.dynamic", "unannotated_model"): ("unknown", "dynamic dispatch"),
    ("czoo.dynamic", "callable_parameter"): ("unknown", "dynamic dispatch"),
}

# The forward whose model class comes from its factory's build function (no annotation).
BUILD_FUNCTIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("czoo.llama_like", "unannotated_with_build"): ("czoo.llama_like", "build_llama"),
}
