"""Spec parsing, mutants, ledger merging and the `tokenstate specs` report (no pytest plugin run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenstate.contracts import ConfigError, ContractDefinitionError
from tokenstate.ledger import Ledger, Mutant, load_specs, mutant, parse_spec
from tokenstate.ledger.ledger import ItemOutcome
from tokenstate.ledger.report import main_specs

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
# Demo

The contract, in one paragraph.

## Owed

- **D-2** Owed thing with `code` inside. — `tests/test_d.py::Suite::test_owed`

## Paid

- **D-1** Paid
  thing. — `tests/test_d.py::test_paid`

## Notes

Anything goes here.
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_d.py").write_text("")
    return tmp_path


def write(spec_dir: Path, text: str, name: str = "demo.md") -> Path:
    path = spec_dir / name
    path.write_text(text)
    return path


def test_a_spec_parses_into_items_with_states_lines_and_tests(spec_dir):
    spec = parse_spec(write(spec_dir, GOOD))
    assert (spec.slug, spec.title, spec.contract) == (
        "demo",
        "Demo",
        "The contract, in one paragraph.",
    )
    owed, paid = spec.items
    assert (owed.id, owed.state, owed.line, owed.text) == (
        "D-2",
        "owed",
        7,
        "Owed thing with `code` inside.",
    )
    assert (owed.test_file, owed.test_name) == (
        spec_dir / "tests" / "test_d.py",
        "Suite::test_owed",
    )
    assert (paid.id, paid.state, paid.line, paid.text) == ("D-1", "paid", 11, "Paid thing.")
    assert paid.test == "tests/test_d.py::test_paid"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace("# Demo\n", "Demo\n"), r"demo.md:1: a spec starts with its title"),
        (lambda s: s.replace("## Paid", "## Done"), r"demo.md:1: missing section\(s\) ## Paid"),
        (lambda s: s.replace("**D-2**", "D-2"), r"demo.md:7: item must start with its bold id"),
        (lambda s: s.replace("**D-2**", "**d2**"), r"demo.md:7: item id 'd2' is not of the form"),
        (
            lambda s: s.replace("`tests/test_d.py::test_paid`", "test_paid"),
            r"demo.md:11: D-1: the item must end with a code span",
        ),
        (
            lambda s: s.replace("D-2** Owed thing with `code` inside. —", "D-2** —"),
            r"demo.md:7: D-2: the item has no text",
        ),
        (
            lambda s: s.replace("**D-2**", "**D-1**"),
            r"demo.md:11: D-1 is listed twice \(first at line 7\)",
        ),
        (
            lambda s: s.replace("Suite::test_owed", "test_paid"),
            r"demo.md:11: D-1: test tests/test_d.py::test_paid already carries D-2",
        ),
        (
            lambda s: s.replace("test_d.py::test_paid", "test_gone.py::test_paid"),
            r"demo.md:11: D-1: test file .*test_gone.py does not exist",
        ),
        (
            lambda s: s.replace("The contract, in one paragraph.\n", ""),
            r"demo.md:1: state the contract",
        ),
        (lambda s: s + "\n## Owed\n", r"demo.md:18: `## Owed` appears twice"),
        (
            lambda s: s.replace("## Owed\n", "## Owed\n\nSome prose.\n"),
            r"demo.md:7: ## Owed may only hold one bullet list",
        ),
        (
            lambda s: s.replace("inside. —", "inside.\n  - nested —"),
            r"demo.md:7: each item is a single paragraph",
        ),
        (
            lambda s: s.replace("## Paid\n", "## Paid\n\n### Bounds\n"),
            r"demo.md:11: ## Paid may only hold one bullet list",
        ),
    ],
)
def test_a_malformed_spec_names_file_and_line(spec_dir, edit, message):
    with pytest.raises(ContractDefinitionError, match=message):
        parse_spec(write(spec_dir, edit(GOOD)))


def test_item_ids_are_unique_across_specs(spec_dir):
    write(spec_dir, GOOD)
    write(
        spec_dir,
        GOOD.replace("test_owed", "test_other").replace("test_paid", "test_more"),
        "again.md",
    )
    write(spec_dir, "# Index\n", "README.md")  # an index page is not a spec
    with pytest.raises(
        ContractDefinitionError, match=r"demo.md:7: D-2 is also defined at .*again.md:7"
    ):
        load_specs([spec_dir])


class Target:
    value = 1

    def scale(self, x, factor, *, rounding=None):
        return x * factor


def test_a_mutant_patches_for_its_block_and_restores_after():
    @mutant("D-1/two", doc="Target.value is 2.")
    def two(patch):
        patch.setattr(Target, "value", 2)

    with two.applied():
        assert Target.value == 2
    assert Target.value == 1 and two.item_id == "D-1" and two.doc == "Target.value is 2."
    with pytest.raises(RuntimeError), two.applied():
        raise RuntimeError("the test under the mutant failed")
    assert Target.value == 1


def test_a_mutant_that_cannot_apply_or_patches_nothing_says_so():
    @mutant("D-1/moved", doc="Patches an attribute that no longer exists.")
    def moved(patch):
        patch.setattr(Target, "renamed", 2)

    @mutant("D-1/nothing", doc="Forgets to patch.")
    def nothing(patch):
        pass

    with (
        pytest.raises(ContractDefinitionError, match="has no attribute 'renamed'"),
        moved.applied(),
    ):
        pass
    with pytest.raises(ContractDefinitionError, match="patched nothing"), nothing.applied():
        pass


@pytest.mark.parametrize(
    ("replacement", "why"),
    [
        (lambda self, x: x, "takes 2 positional arguments where the original takes 3"),
        (lambda self, x, factor, extra: x, "needs 'extra', which the original does not take"),
        (lambda self, x, factor: x, "takes no keyword 'rounding'"),
        (lambda self, x, factor, *, rounding: x, "needs 'rounding', which the original does not need"),
    ],
)
def test_a_mutant_whose_replacement_cannot_take_the_originals_calls_is_refused(replacement, why):
    # A replacement that no longer fits the code's calls fails with a TypeError: red for the wrong
    # reason, which would keep a red-before "proved" after the code it reverts was refactored.
    @mutant("D-1/misfit", doc="Replaces scale with something that does not fit its calls.")
    def misfit(patch):
        patch.setattr(Target, "scale", replacement)

    with pytest.raises(ContractDefinitionError, match=f"D-1/misfit: the replacement of .*scale {why}"), misfit.applied():
        pass
    assert Target().scale(2, 3) == 6


@pytest.mark.parametrize(
    "replacement",
    [
        lambda self, x, factor, *, rounding=None: 0,
        lambda self, *args, **kwargs: 0,
        lambda self, x, factor=2, extra=None, **kwargs: 0,
        staticmethod(lambda *args, **kwargs: 0),
        property(lambda self: 0),
    ],
)
def test_a_replacement_that_takes_every_call_of_the_original_is_accepted(replacement):
    @mutant("D-1/fits", doc="Replaces scale with something that takes its calls.")
    def fits(patch):
        patch.setattr(Target, "scale", replacement)

    with fits.applied():
        pass


@pytest.mark.parametrize(("name", "doc"), [("stale", "x"), ("D-1/Bad_Name", "x"), ("D-1/ok", "  ")])
def test_a_mutant_needs_an_item_scoped_name_and_a_doc(name, doc):
    with pytest.raises(ContractDefinitionError):
        Mutant(name, doc, lambda patch: None)


def test_the_ledger_keeps_results_of_items_not_run_and_drops_removed_items(spec_dir, tmp_path):
    spec = parse_spec(write(spec_dir, GOOD))
    first_run = {"D-1": ItemOutcome(), "D-2": ItemOutcome()}
    first_run["D-1"].add("t::test_paid", "passed", True)
    first_run["D-1"].mutant = "D-1/bug"
    first_run["D-2"].add("t::Suite::test_owed", "xfailed", None)
    first = Ledger.build([spec], tmp_path, first_run, {"demo": "passed"})
    second_run = {"D-2": ItemOutcome()}
    second_run["D-2"].add("t::Suite::test_owed[a]", "xfailed", None)
    second_run["D-2"].add("t::Suite::test_owed[b]", "error", None)  # the worst case wins
    second = Ledger.build([spec], tmp_path, second_run, {}, previous=first)
    by_id = {e.id: e for e in second.items}
    assert (by_id["D-1"].last_result, by_id["D-1"].red_before_verified, by_id["D-1"].mutant) == (
        "passed",
        True,
        "D-1/bug",
    )
    # a subset run (no cross-check): the case it did not run stays on the record beside its two
    assert by_id["D-2"].last_result == "error" and len(by_id["D-2"].nodeids) == 3
    assert second.specs[0].cross_check == "passed"
    assert Ledger.build([], tmp_path, {}, {}, previous=second).items == []


def test_a_subset_run_of_some_cases_never_clears_what_the_others_last_proved(spec_dir, tmp_path):
    """-k running one parametrised case of a paid item whose other case lost red-before: the item
    stays unhealthy (a full run, with its cross-check, is what may clear it)."""
    spec = parse_spec(write(spec_dir, GOOD))
    full = {"D-1": ItemOutcome()}
    full["D-1"].add("t::test_paid[1]", "passed", False)
    full["D-1"].add("t::test_paid[2]", "passed", True)
    first = Ledger.build([spec], tmp_path, full, {"demo": "passed"})
    assert {e.id: e for e in first.items}["D-1"].red_before_verified is False
    subset = {"D-1": ItemOutcome()}
    subset["D-1"].add("t::test_paid[2]", "passed", True)
    second = {e.id: e for e in Ledger.build([spec], tmp_path, subset, {}, previous=first).items}
    assert second["D-1"].red_before_verified is False and sorted(second["D-1"].nodeids) == ["t::test_paid[1]", "t::test_paid[2]"]
    rerun = {"D-1": ItemOutcome()}
    rerun["D-1"].add("t::test_paid[1]", "passed", True)
    rerun["D-1"].add("t::test_paid[2]", "passed", True)
    third = {e.id: e for e in Ledger.build([spec], tmp_path, rerun, {"demo": "passed"}, previous=first).items}
    assert third["D-1"].red_before_verified is True  # a full run decides afresh


def test_a_ledger_whose_item_ids_are_not_spec_ids_is_refused_as_a_usage_error(tmp_path, capsys):
    path = tmp_path / "ledger.json"
    good = Ledger([], []).to_json()
    item = {"id": "NOTANID", "spec": "x", "state": "paid", "test": "t.py::test_x", "text": "", "spec_file": "x.md", "spec_line": 1}
    path.write_text(json.dumps({**good, "items": [item]}))
    with pytest.raises(ConfigError, match=r"item ids \['NOTANID'\] are not spec item ids"):
        Ledger.read(path)
    assert main_specs(["--ledger", str(path)]) == 2


def test_the_ledger_round_trips_through_its_file_and_refuses_garbage(spec_dir, tmp_path):
    spec = parse_spec(write(spec_dir, GOOD))
    path = tmp_path / "out" / "ledger.json"
    Ledger.build([spec], tmp_path, {}, {}).write(path)
    assert Ledger.read(path) == Ledger.from_json(json.loads(path.read_text()))
    path.write_text('{"version": 99}')
    with pytest.raises(ConfigError, match="not a version-1 tokenstate ledger"):
        Ledger.read(path)
    with pytest.raises(ConfigError, match="run the test suite"):
        Ledger.read(tmp_path / "missing.json")


def _ledger_file(tmp_path: Path, red_before: bool) -> Path:
    entry = {
        "id": "SHI-1",
        "spec": "stale-host-ids",
        "state": "paid",
        "test": "t.py::test_a",
        "text": "x",
        "spec_file": "specs/stale-host-ids.md",
        "spec_line": 3,
        "red_before_verified": red_before,
        "last_result": "passed",
        "mutant": "SHI-1/stale-read-allowed",
        "future_key": "ignored",
    }
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"version": 1, "generated": "now", "items": [entry], "specs": []}))
    return path


def test_specs_command_prints_table_and_json_and_its_status(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes the table to the terminal
    path = _ledger_file(tmp_path, red_before=True)
    assert main_specs(["--ledger", str(path)]) == 0
    table = capsys.readouterr().out
    assert "SHI-1" in table and "verified" in table and "stale-read-allowed" in table
    assert main_specs(["--ledger", str(path), "--json"]) == 0
    item = json.loads(capsys.readouterr().out)["items"][0]
    assert {
        k: item[k] for k in ("id", "spec", "state", "test", "red_before_verified", "last_result")
    } == {
        "id": "SHI-1",
        "spec": "stale-host-ids",
        "state": "paid",
        "test": "t.py::test_a",
        "red_before_verified": True,
        "last_result": "passed",
    }
    assert main_specs(["--ledger", str(_ledger_file(tmp_path, red_before=False))]) == 1
    assert "LOST" in capsys.readouterr().out
    assert main_specs(["--ledger", str(tmp_path / "none.json")]) == 2
    assert "no ledger at" in capsys.readouterr().err
    assert main_specs(["--ledger", str(path), "--spec", "nope"]) == 2


def test_specs_table_folds_long_names_on_a_narrow_terminal(tmp_path, capsys, monkeypatch):
    """At 80 columns (or with no terminal) a slug, mutant or test name is folded, never cut."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main_specs(["--ledger", str(_ledger_file(tmp_path, red_before=True))]) == 0
    table = capsys.readouterr().out
    assert "…" not in table
    body = [line.split("│")[1:-1] for line in table.splitlines() if line.startswith("│")]  # one item: one row
    cells = ["".join(part[column].strip() for part in body) for column in range(len(body[0]))]
    assert {"stale-host-ids", "stale-read-allowed", "test_a"} <= set(cells), cells


def test_the_stale_host_ids_spec_lists_the_promised_items():
    (spec,) = [s for s in load_specs([REPO / "specs"]) if s.slug == "stale-host-ids"]
    ids = {item.id for item in spec.items}
    assert len(ids) >= 9 and ids == {f"SHI-{n}" for n in range(1, len(ids) + 1)}
    paid = {item.id for item in spec.items if item.state == "paid"}
    assert {"SHI-1", "SHI-3", "SHI-4", "SHI-5"} <= paid
    assert all(item.test_file.is_file() for item in spec.items)


def test_specs_without_any_ledger_says_where_it_looked(tmp_path, monkeypatch, capsys):
    (tmp_path / "project" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "sub")
    assert main_specs([]) == 2
    err = capsys.readouterr().err
    assert f"no .tokenstate/ledger.json in {tmp_path / 'project' / 'sub'} or any folder above it" in err
    assert "--ledger PATH" in err


@pytest.mark.parametrize(("field", "value"), [("test", 5), ("mutant", 5), ("red_before_verified", "yes"), ("spec_line", True)])
def test_a_ledger_field_of_the_wrong_type_is_an_unreadable_ledger(tmp_path, capsys, field, value):
    path = _ledger_file(tmp_path, red_before=True)
    data = json.loads(path.read_text())
    data["items"][0][field] = value
    path.write_text(json.dumps(data))
    assert main_specs(["--ledger", str(path)]) == 2
    assert f"fields of the wrong type (SHI-1.{field})" in capsys.readouterr().err


def test_a_ledger_that_proves_nothing_is_not_healthy(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    Ledger([], [], "now", ["specs"]).write(empty)
    assert main_specs(["--ledger", str(empty)]) == 1
    assert "nothing is proven — it lists no spec items (spec folders: specs)" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    Ledger([], [], "now", ["specs"], error="specs/a.md:3: D-1 is also defined at specs/b.md:4").write(broken)
    assert main_specs(["--ledger", str(broken)]) == 1
    assert "could not read the specs:\nspecs/a.md:3: D-1 is also defined" in capsys.readouterr().err


def test_a_test_reference_with_spaces_is_refused_saying_so(tmp_path):
    spec = tmp_path / "s.md"
    spec.write_text("# S\n\nC.\n\n## Owed\n\n- **S-1** Not yet. — `../unit tests/test_x.py::test_y`\n\n## Paid\n")
    with pytest.raises(ContractDefinitionError, match=r"the test reference `\.\./unit tests/test_x\.py::test_y` holds whitespace"):
        parse_spec(spec)


def test_a_failed_cross_check_makes_the_ledger_unhealthy_and_json_always_prints(tmp_path, capsys):
    path = _ledger_file(tmp_path, red_before=True)
    data = json.loads(path.read_text())
    data["specs"] = [{"spec": "stale-host-ids", "title": "T", "file": "specs/s.md", "cross_check": "failed", "timestamp": "t"}]
    path.write_text(json.dumps(data))
    assert main_specs(["--ledger", str(path)]) == 1
    assert "the cross-check of stale-host-ids failed" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    Ledger([], [], "now", ["specs"], error="clash").write(empty)
    assert main_specs(["--ledger", str(empty), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "clash"


@pytest.mark.parametrize(("field", "value"), [("spec_dirs", "specs"), ("generated", 5), ("error", ["x"])])
def test_top_level_ledger_fields_of_the_wrong_type_are_an_unreadable_ledger(tmp_path, capsys, field, value):
    path = _ledger_file(tmp_path, red_before=True)
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    assert main_specs(["--ledger", str(path)]) == 2
    assert f"fields of the wrong type ({field})" in capsys.readouterr().err


def test_an_unreadable_spec_document_is_a_clear_error(tmp_path):
    (tmp_path / "latin.md").write_bytes(b"# L\n\nCaf\xe9.\n\n## Owed\n\n## Paid\n")
    (tmp_path / "assets.md").mkdir()  # a folder named like a document is none
    with pytest.raises(ContractDefinitionError, match=r"latin\.md: not UTF-8 text"):
        load_specs([tmp_path])


def test_spec_like_documents_are_recognised_as_the_parser_reads_headings(tmp_path):
    from tokenstate.ledger.spec import looks_like_spec

    fenced = tmp_path / "howto.md"
    fenced.write_text("# How to\n\n```markdown\n## Owed\n\n## Paid\n```\n")
    setext = tmp_path / "old.md"
    setext.write_text("# Old\n\nC.\n\nowed\n----\n\npaid\n----\n")
    assert not looks_like_spec(fenced) and looks_like_spec(setext)


def test_a_byte_order_mark_before_the_title_is_no_text(spec_dir):
    path = spec_dir / "demo.md"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert [i.id for i in parse_spec(path).items] == ["D-2", "D-1"]
