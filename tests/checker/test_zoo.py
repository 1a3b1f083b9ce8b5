"""The routing checker over the zoo: every pattern, honouring and ignoring, gets its expected verdict."""

from __future__ import annotations

import json

from tokenstate.checker import CheckReport, EntryResult, Verdict

# Pattern families the issue names; each must appear in an honouring and an ignoring variant.
FAMILIES = {
    "direct calls": ("direct calls",),
    "methods": ("methods through the hierarchy", "super()", "attributes holding sub-modules"),
    "module aliases and re-exports": ("module aliases", "re-exports"),
    "class aliases": ("class aliases",),
    "functools.partial": ("functools.partial",),
    "scopes": ("scope (ContextVar)", "scope (@contextmanager + global)", "scope (threading.local)",
               "scope (class attribute)"),
    "shared dense block": ("shared dense block + class alias", "shared dense block"),
}


def line_of(zoo, file: str, text: str, after: str = "") -> int:
    """1-based line of the first ``text`` in a zoo file (after the line containing ``after``)."""
    lines = (zoo.root / file).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def test_zoo_entry_gets_its_expected_verdict(zoo, zoo_report: CheckReport, zoo_entry: str) -> None:
    expected, pattern = zoo.expected[zoo_entry]
    result = zoo_report.by_entry()[zoo_entry]
    assert result.error is None, result.error
    assert result.verdict is expected, f"{zoo_entry} ({pattern}): {result.verdict.value}\n{zoo_report.render()}"


def test_every_pattern_family_has_an_honouring_and_an_ignoring_case(zoo) -> None:
    for family, patterns in FAMILIES.items():
        verdicts = {v for v, p in zoo.expected.values() if p in patterns}
        assert {Verdict.HONORS, Verdict.IGNORES} <= verdicts, family
    assert {v for v, _ in zoo.expected.values()} == set(Verdict)


def test_ignoring_route_is_the_full_chain_with_file_and_line(zoo, zoo_report: CheckReport) -> None:
    result = zoo_report.by_entry()["czoo.hierarchy.overridden_to_host"]
    route = next(r for r in result.routes if r.kind == "ignores")
    chain = [(hop.function, hop.file, hop.line) for hop in route.hops]
    hierarchy, models = "czoo/hierarchy.py", "czoo/models.py"
    assert chain == [
        ("czoo.hierarchy.overridden_to_host", hierarchy, line_of(zoo, hierarchy, "return model.run(inp)", "def overridden_to_host")),
        ("czoo.hierarchy.BaseLM.run", hierarchy, line_of(zoo, hierarchy, "return self.head(self.embed(")),
        ("czoo.hierarchy.BaseLM.embed", hierarchy, line_of(zoo, hierarchy, "return self.embedder(ids)")),
        ("czoo.models.GuardedEmbedder.forward", models, line_of(zoo, models, "return guarded_embedding(ids, self.weight)")),
    ]
    # the source is the overriding method in the subclass, not the base class's device read
    source_line = line_of(zoo, hierarchy, "return inp.host_tokens.ids", "class HostDerivedLM")
    assert route.source == f"inp.host_tokens.ids ({hierarchy}:{source_line})"
    assert route.sink.endswith("guarded_embedding(ids)")


def test_scope_route_crosses_from_publisher_to_deep_consumer(zoo, zoo_report: CheckReport) -> None:
    result = zoo_report.by_entry()["czoo.scoped_models.contextvar_scope_host"]
    (route,) = [r for r in result.routes if r.kind == "ignores" and "embed" in r.sink]
    assert route.hops[0].function == "czoo.scoped_models.contextvar_scope_host"
    assert route.hops[-1].function == "czoo.scopes.DeepEmbed.forward"
    source_line = line_of(zoo, "czoo/scopes.py", "return self.inp.host_tokens.ids", "class HostScope")
    assert route.source == f"inp.host_tokens.ids (czoo/scopes.py:{source_line})"


def test_unknown_routes_say_what_could_not_be_resolved(zoo_report: CheckReport) -> None:
    by_entry = zoo_report.by_entry()
    assert "getattr() with a computed name" in by_entry["czoo.dynamic.getattr_dispatch"].routes[0].source
    assert "annotate the forward's model parameter" in by_entry["czoo.dynamic.unannotated_model"].routes[0].source
    assert "no enclosing scope publishes it" in by_entry["czoo.scoped_models.no_scope_opened"].routes[0].source
    assert all(by_entry[e].finding for e in by_entry if by_entry[e].verdict is Verdict.UNKNOWN)


def test_json_report_is_stable_and_complete(zoo) -> None:
    sink_line = line_of(zoo, "czoo/helpers.py", "return guarded_embedding(ids, weight)")
    first, second = zoo.run().to_json(), zoo.run().to_json()
    assert first == second
    payload = json.loads(first)
    assert payload["entry_points"] == len(zoo.expected)
    row = next(r for r in payload["results"] if r["entry"] == "czoo.calls.via_host_helper")
    assert set(row) == {"entry", "function", "file", "line", "declared", "verdict", "finding", "note", "routes"}
    assert row["verdict"] == "ignores" and row["finding"] and row["note"] is None
    assert row["routes"][0]["chain"][-1] == {"function": "czoo.helpers.embed_ids", "file": "czoo/helpers.py", "line": sink_line}


def test_every_zoo_verdict_is_justified_in_the_concepts_page(zoo) -> None:
    page = zoo.root.parents[2] / "docs" / "concepts" / "checker-verdicts.md"
    rows = {}
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`czoo."):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    assert set(rows) == set(zoo.expected)
    for entry, (verdict, _) in zoo.expected.items():
        assert rows[entry][0] == verdict.value and len(rows[entry][1]) > 10, entry


def test_a_non_embedding_host_read_is_reported_where_it_happens(zoo, zoo_report: CheckReport) -> None:
    result = zoo_report.by_entry()["czoo.host_reads.penalty_from_host_rows"]
    (route,) = [r for r in result.routes if r.kind == "ignores" and r.sink.startswith("reads host ids")]
    line = line_of(zoo, "czoo/host_reads.py", "inp.host_tokens.row_ids(r.row)")
    assert "raises StaleHostTokensError" in route.sink
    assert route.source == f"inp.host_tokens.row_ids() (czoo/host_reads.py:{line})"
    assert [h.line for h in route.hops] == [line]
    assert "take metadata from the forward input" in (result.finding or "")


def test_unknown_routes_name_the_code_out_of_sight(zoo_report: CheckReport) -> None:
    by_entry = zoo_report.by_entry()
    assert "wrapped by @torch.compile" in by_entry["czoo.compiled.compiled_function"].routes[0].source
    assert "handed to torch.utils.checkpoint.checkpoint" in by_entry["czoo.compiled.checkpointed_embedding"].routes[0].source
    assert "module name computed at run time" in by_entry["czoo.imports.import_module_computed"].routes[0].source
    assert "filled at run time" in by_entry["czoo.dispatch.dict_filled_at_run_time"].routes[0].source


def test_a_declared_forward_that_embeds_nothing_gets_a_note_not_a_finding() -> None:
    """Inert is right for a forward that embeds no ids, so it is no finding; declared honouring, it
    may also be an embedding the checker does not see, which the report says."""
    inert = EntryResult("pool", "pool", "m.py", 3, True, Verdict.INERT)
    undeclared = EntryResult("pool", "pool", "m.py", 3, None, Verdict.INERT)
    assert inert.finding is None and "no route embeds token ids" in (inert.note or "")
    assert undeclared.note is None and EntryResult("f", "f", "m.py", 3, True, Verdict.HONORS).note is None
    text = CheckReport([inert]).render()
    assert "[ok] pool: inert (declared honors)" in text and "    note: declared honouring" in text
    assert text.endswith("1 entry point(s) checked, 0 finding(s).")
