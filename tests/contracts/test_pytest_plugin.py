"""The tokenstate pytest plugin, exercised on small throw-away projects with pytester."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest_plugins = ["pytester"]

SPEC = """\
# Demo contract

The guard refuses negative numbers.

## Owed

- **D-2** The guard also refuses NaN. — `tests/test_demo.py::test_nan_refused`

## Paid

- **D-1** The guard refuses negative numbers. — `tests/test_demo.py::test_negative_refused`
"""

TESTS = """\
import math
import pytest
from tokenstate.ledger import mutant


class Guard:
    @staticmethod
    def check(x):
        if x < 0:
            raise ValueError("negative")
        return x


@mutant("D-1/negatives-allowed", doc="Guard.check accepts everything.")
def negatives_allowed(patch):
    patch.setattr(Guard, "check", staticmethod(lambda x: x))


@mutant("D-1/harmless", doc="Replaces Guard.check by an identical copy: the test cannot see it.")
def harmless(patch):
    patch.setattr(Guard, "check", staticmethod(Guard.check))


@pytest.mark.paid("D-1", before={before})
def test_negative_refused():
    with pytest.raises(ValueError):
        Guard.check(-1)
    assert Guard.check(2) == 2


@pytest.mark.owed("D-2")
def test_nan_refused():
    with pytest.raises(ValueError):
        Guard.check({nan})
"""


def make_project(
    pytester: pytest.Pytester,
    spec: str = SPEC,
    before: str = "negatives_allowed",
    nan: str = "math.nan",
    extra: str = "",
) -> None:
    pytester.makefile(".md", **{"specs/demo": spec})
    tests = TESTS.format(before=before, nan=nan) + textwrap.dedent(extra)
    pytester.makepyfile(**{"specs/tests/test_demo": tests})


def ledger(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / ".tokenstate" / "ledger.json").read_text())


def entries(pytester: pytest.Pytester) -> dict[str, dict]:
    return {e["id"]: e for e in ledger(pytester)["items"]}


def test_paid_and_owed_items_and_the_ledger_json(pytester):
    make_project(pytester)
    result = pytester.runpytest("-rx")
    result.assert_outcomes(
        passed=2, xfailed=1
    )  # the paid test, the spec's cross-check; the owed test
    result.stdout.fnmatch_lines(
        ["*XFAIL*test_nan_refused*owed D-2, still failing: *DID NOT RAISE*"]
    )
    paid, owed = entries(pytester)["D-1"], entries(pytester)["D-2"]
    assert paid == paid | {
        "spec": "demo",
        "state": "paid",
        "test": "tests/test_demo.py::test_negative_refused",
        "red_before_verified": True,
        "last_result": "passed",
        "mutant": "D-1/negatives-allowed",
        "mutant_doc": "Guard.check accepts everything.",
        "spec_file": "specs/demo.md",
        "spec_line": 11,
        "nodeids": ["specs/tests/test_demo.py::test_negative_refused"],
    }
    assert (
        owed["state"] == "owed"
        and owed["last_result"] == "xfailed"
        and owed["red_before_verified"] is None
    )
    assert owed["text"] == "The guard also refuses NaN." and owed["timestamp"]
    assert ledger(pytester)["specs"] == [
        {
            "spec": "demo",
            "title": "Demo contract",
            "file": "specs/demo.md",
            "cross_check": "passed",
            "timestamp": ledger(pytester)["specs"][0]["timestamp"],
        }
    ]


def test_an_owed_test_that_passes_fails_the_run(pytester):
    make_project(pytester, nan="-1")
    result = pytester.runpytest("--tokenstate-ledger", "elsewhere/ledger.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*D-2 now passes: move it to ## Paid and name its before-mutant*demo.md:7*"]
    )
    written = json.loads((pytester.path / "elsewhere" / "ledger.json").read_text())
    assert {e["id"]: e["last_result"] for e in written["items"]} == {
        "D-1": "passed",
        "D-2": "xpassed",
    }
    assert not (pytester.path / ".tokenstate").exists()


@pytest.mark.parametrize("strict", [True, False])
def test_an_owed_test_that_passes_fails_the_run_whatever_xfail_mark_it_also_carries(pytester, strict):
    """A user's own ``@pytest.mark.xfail`` beside ``owed`` must not turn "now passes" into a
    healthy ``xfailed`` (strict) or a reported failure that leaves the run green (not strict)."""
    make_project(pytester, nan="-1")
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    tests.write_text(tests.read_text().replace(
        '@pytest.mark.owed("D-2")', f'@pytest.mark.owed("D-2")\n@pytest.mark.xfail(strict={strict})'
    ))
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*D-2 now passes: move it to ## Paid*"])
    assert entries(pytester)["D-2"]["last_result"] == "xpassed"


def test_a_paid_test_that_passes_under_its_mutant_fails(pytester):
    make_project(pytester, before="harmless")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*red-before lost: D-1 no longer detects its bug*still passes under mutant D-1/harmless*"]
    )
    assert entries(pytester)["D-1"] | {} == entries(pytester)["D-1"] | {
        "red_before_verified": False,
        "last_result": "red-before-lost",
    }


def test_the_mutant_is_undone_after_the_rerun(pytester):
    make_project(
        pytester,
        extra="""
        def test_after_the_paid_test():
            with pytest.raises(ValueError):
                Guard.check(-5)
    """,
    )
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=3, xfailed=1)


def test_an_orphan_marker_fails(pytester):
    make_project(
        pytester,
        extra="""
        @pytest.mark.owed("D-9")
        def test_unlisted():
            assert False
    """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, xfailed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*(line *): orphan marker @pytest.mark.owed('D-9') names no item of any spec*"]
    )


def test_an_item_without_its_test_fails_the_cross_check(pytester):
    spec = (
        SPEC + "- **D-3** The guard returns its input. — `tests/test_demo.py::test_returns_input`\n"
    )
    make_project(pytester, spec=spec)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*demo.md:12: D-3 has no test: `tests/test_demo.py::test_returns_input` does not exist*"]
    )


def test_an_item_carried_by_the_wrong_marker_or_test_fails(pytester):
    make_project(
        pytester,
        extra="""
        @pytest.mark.paid("D-2", before=negatives_allowed)
        def test_also_nan():
            pass
    """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1, xfailed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_also_nan*D-2 is listed under ## Owed (*demo.md:7) but the test is marked paid*",
            "*demo.md:7: D-2 is carried by *test_demo.py::test_also_nan instead of / besides*",
        ]
    )


def test_a_malformed_spec_is_a_collection_error_with_file_and_line(pytester):
    make_project(pytester, spec=SPEC.replace("- **D-1** The guard", "- D-1 The guard"))
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*demo.md:11: item must start with its bold id*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_a_subset_run_skips_the_cross_check_and_keeps_earlier_results(pytester):
    make_project(pytester)
    pytester.runpytest().assert_outcomes(passed=2, xfailed=1)
    first = entries(pytester)["D-2"]
    result = pytester.runpytest("specs/tests/test_demo.py::test_negative_refused")
    result.assert_outcomes(passed=1)
    assert entries(pytester)["D-2"] == first  # not run this time: the earlier result stays
    assert entries(pytester)["D-1"]["red_before_verified"] is True


def test_checks_option_refuses_when_tokenstate_was_imported_first(pytester):
    # This process imported tokenstate.contracts already: the hook could not see those modules.
    import tokenstate.contracts  # noqa: F401

    make_project(pytester)
    result = pytester.runpytest_inprocess("--tokenstate-checks")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--tokenstate-checks: these modules were imported before beartype's import hook could be installed*"]
    )


MISTYPED = """
import pytest
from beartype.roar import BeartypeCallHintViolation

def test_mistyped_call():
    from tokenstate.ledger.ledger import worst_result
    {body}
"""


def test_checks_option_type_checks_tokenstate_modules(pytester):
    pytester.makepyfile(
        MISTYPED.format(
            body="with pytest.raises(BeartypeCallHintViolation):\n        worst_result(None, 0)"
        )
    )
    pytester.runpytest_subprocess("--tokenstate-checks", "-p", "no:cacheprovider").assert_outcomes(
        passed=1
    )


def test_under_the_checks_option_the_public_api_still_validates_its_own_inputs(pytester):
    """The modules that take a user's arguments (``LLM``, ``SamplingParams``, the registry, the gate
    assertion) say what is wrong with a ``ConfigError``; beartype's hook must neither pre-empt that
    nor refuse the inputs they document (vLLM's ``None`` defaults, numpy ids)."""
    pytester.makepyfile(
        """
import numpy as np
import pytest

def test_public_inputs():
    from tokenstate.contracts import ConfigError, ContractDefinitionError
    from tokenstate.runtime import LLM, SamplingParams, register
    from tokenstate.testing import assert_async_equals_sync

    assert SamplingParams(stop_token_ids=None, bad_words=None).stop_token_ids == ()
    assert SamplingParams(stop_token_ids=np.array([5]), bad_words=[[5], [7, 8]]).bad_words == ((5,), (7, 8))
    with pytest.raises(ConfigError, match="max_tokens must be an int"):
        SamplingParams(max_tokens="5")
    with pytest.raises(ConfigError, match="max_num_seqs must be a positive int"):
        LLM("tiny-llama", max_num_seqs="2")
    with pytest.raises(ContractDefinitionError, match="takes a ModelFactory"):
        register(5)
    with pytest.raises(ConfigError):
        assert_async_equals_sync("tiny-llama", max_tokens="5")
"""
    )
    pytester.runpytest_subprocess("--tokenstate-checks", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_checked_user_package_may_register_its_own_entry_point_forwards(pytester):
    """``--tokenstate-checks-package myengine`` (the option checked-pytest.md documents) wraps every
    function of the user's package in beartype, entry points included: the registry still takes
    the entry point, which checks its own calls."""
    pytester.mkpydir("myengine")
    pytester.path.joinpath("myengine", "__init__.py").write_text(
        "from tokenstate.contracts import ForwardInput, entry_point\n"
        "from tokenstate.models.toy import toy_factory, toy_forward\n"
        "from tokenstate.runtime import register\n"
        "import dataclasses\n\n"
        "@entry_point\n"
        "def forward(model, inp: ForwardInput):\n"
        "    return toy_forward.__wrapped__(model, inp)\n\n"
        "register(dataclasses.replace(toy_factory('MineLM'), forward=forward))\n"
    )
    pytester.makepyfile(
        "def test_it():\n"
        "    import myengine\n"
        "    from tokenstate.runtime import LLM, SamplingParams\n"
        "    (out,) = LLM('minelm', async_scheduling=True).generate([[1, 2, 3]], SamplingParams(max_tokens=4))\n"
        "    assert len(out.token_ids) == 4\n"
    )
    result = pytester.runpytest_subprocess("--tokenstate-checks-package", "myengine", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_without_the_checks_option_a_mistyped_call_goes_unchecked(pytester):
    pytester.makepyfile(MISTYPED.format(body="assert worst_result(None, 0) == 0"))
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


@pytest.mark.slow  # three interpreters start (controller and two workers): ~10 s on an idle machine
def test_xdist_workers_results_merge_into_one_ledger(pytester):
    spec = (
        SPEC + "- **D-3** The guard returns its input. — `tests/test_demo.py::test_returns_input`\n"
    )
    make_project(
        pytester,
        spec=spec,
        extra="""
        @mutant("D-3/returns-none", doc="Guard.check returns None.")
        def returns_none(patch):
            patch.setattr(Guard, "check", staticmethod(lambda x: None))

        @pytest.mark.paid("D-3", before=returns_none)
        def test_returns_input():
            assert Guard.check(3) == 3
    """,
    )
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, xfailed=1)
    items = entries(pytester)
    assert {i: (e["last_result"], e["red_before_verified"]) for i, e in items.items()} == {
        "D-1": ("passed", True),
        "D-2": ("xfailed", None),
        "D-3": ("passed", True),
    }
    assert ledger(pytester)["specs"][0]["cross_check"] == "passed"


@pytest.mark.parametrize("where", ["a_file/ledger.json", "a_dir"])
def test_a_ledger_path_that_cannot_be_written_is_refused_before_the_tests(pytester, where):
    pytester.makefile(".txt", a_file="not a folder")
    (pytester.path / "a_file.txt").rename(pytester.path / "a_file")
    (pytester.path / "a_dir").mkdir()
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess(f"--tokenstate-ledger={where}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tokenstate-ledger *: the ledger cannot be written there*"])


def test_a_default_ledger_location_that_cannot_be_written_fails_the_run_with_a_message(pytester):
    make_project(pytester)
    (pytester.path / ".tokenstate").write_text("a file where the ledger's folder would go")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*tokenstate ledger: cannot write *ledger.json*pass --tokenstate-ledger=PATH*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_spec_tests_runs_the_spec_documents_and_exactly_the_tests_they_name(pytester, monkeypatch):
    """``--tokenstate-spec-tests`` (what ``tokenstate verify`` runs): the configured spec folders and
    the named tests wherever they live; other tests — even in the same file — do not run."""
    spec = SPEC.replace("`tests/test_demo.py::test_negative_refused`", "`../tests/test_demo.py::test_negative_refused`")
    spec = spec.replace("`tests/test_demo.py::test_nan_refused`", "`../tests/test_demo.py::test_nan_refused`")
    pytester.makeini("[pytest]\ntokenstate_specs = contracts\nxfail_strict = true\n")
    pytester.makefile(".md", **{"contracts/demo": spec})
    extra = "\n\ndef test_not_named_by_any_spec():\n    assert False\n"
    pytester.makepyfile(**{"tests/test_demo": TESTS.format(before="negatives_allowed", nan="math.nan") + extra})
    pytester.makepyfile(**{"tests/test_other": "def test_other():\n    assert False\n"})
    (pytester.path / "pkg").mkdir()
    monkeypatch.chdir(pytester.path / "pkg")  # run from a subfolder: pytest still finds the ini
    result = pytester.runpytest("--tokenstate-spec-tests", "-p", "no:randomly")
    result.assert_outcomes(passed=2, xfailed=1, deselected=1)  # D-1 and the cross-check; D-2
    assert ledger(pytester)["spec_dirs"] == ["contracts"]
    assert {e["id"]: e["last_result"] for e in ledger(pytester)["items"]} == {"D-1": "passed", "D-2": "xfailed"}


def test_spec_tests_refuses_test_paths_and_writes_an_empty_ledger_when_there_are_no_specs(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--tokenstate-spec-tests", "test_x.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tokenstate-spec-tests collects the spec documents and the tests they name itself; drop the test paths given on the command line or in addopts (test_x.py)*"])
    result = pytester.runpytest("--tokenstate-spec-tests")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert (ledger(pytester)["spec_dirs"], ledger(pytester)["specs"]) == (["specs"], [])


def test_a_marker_in_the_wrong_state_fails_the_spec_cross_check(pytester):
    make_project(pytester, extra="")
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    tests.write_text(tests.read_text().replace('@pytest.mark.owed("D-2")', '@pytest.mark.paid("D-2", before=harmless)'))
    result = pytester.runpytest("-p", "no:randomly")
    result.stdout.fnmatch_lines(["*D-2 is listed under ## Owed but specs/tests/test_demo.py::test_nan_refused (line *) (@pytest.mark.paid) carries it*"])
    assert ledger(pytester)["specs"][0]["cross_check"] == "failed"


def test_a_paid_unittest_method_is_refused_with_what_to_do(pytester):
    pytester.makefile(".md", **{"specs/ut": SPEC.replace("test_negative_refused", "TestGuard::test_negative_refused")})
    pytester.makepyfile(**{"specs/tests/test_demo": TESTS.format(before="negatives_allowed", nan="math.nan")
                           .replace("@pytest.mark.paid(\"D-1\", before=negatives_allowed)\ndef test_negative_refused():\n    with pytest.raises(ValueError):\n        Guard.check(-1)\n    assert Guard.check(2) == 2",
                                    "import unittest\n\n\nclass TestGuard(unittest.TestCase):\n    @pytest.mark.paid(\"D-1\", before=negatives_allowed)\n    def test_negative_refused(self):\n        self.assertEqual(Guard.check(2), 2)\n        with self.assertRaises(ValueError):\n            Guard.check(-1)")})
    result = pytester.runpytest("-p", "no:randomly")
    result.stdout.fnmatch_lines(["*paid D-1 is a unittest.TestCase method, which cannot be re-run under its mutant*"])


def test_ids_clashing_across_specs_are_named_by_the_spec_run(pytester):
    make_project(pytester)
    pytester.makefile(".md", **{"specs/other": "# Other\n\nAlso.\n\n## Owed\n\n## Paid\n\n- **D-1** Again. — `tests/test_demo.py::test_negative_refused`\n"})
    result = pytester.runpytest("--tokenstate-spec-tests", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*the specs cannot be read together:", "*D-1 is also defined at*ids are global."])
    written = ledger(pytester)
    assert written["items"] == [] and "ids are global" in written["error"]


def test_spec_tests_run_every_case_whatever_addopts_deselect(pytester):
    make_project(pytester, extra="""
        @pytest.mark.slow
        def test_slow_case():
            pass
    """)
    pytester.makeini("[pytest]\naddopts = -m 'not slow'\nmarkers = slow\nxfail_strict = true\n")
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    tests.write_text(tests.read_text().replace('@pytest.mark.paid("D-1"', '@pytest.mark.slow\n@pytest.mark.paid("D-1"'))
    result = pytester.runpytest("--tokenstate-spec-tests", "-p", "no:randomly")
    result.assert_outcomes(passed=2, xfailed=1, deselected=1)  # the slow D-1 ran; the unnamed slow case did not
    assert {e["id"]: e["last_result"] for e in ledger(pytester)["items"]} == {"D-1": "passed", "D-2": "xfailed"}


def test_spec_tests_refuse_missing_spec_folders_and_spec_documents_in_subfolders(pytester):
    make_project(pytester)
    pytester.makeini("[pytest]\ntokenstate_specs =\n    specs\n    more_specs\n")
    result = pytester.runpytest("--tokenstate-spec-tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the spec folders *more_specs named by tokenstate_specs do not exist*"])
    pytester.makeini("[pytest]\n")
    (pytester.path / "specs" / "sub").mkdir()
    (pytester.path / "specs" / "sub" / "hidden.md").write_text("# Hidden\n\n## Owed\n\n## Paid\n")
    result = pytester.runpytest("--tokenstate-spec-tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*hidden.md look like spec documents but sit in a subfolder of a spec folder*"])


def test_a_full_spec_run_that_cannot_collect_a_test_keeps_nothing_of_the_last_run(pytester):
    make_project(pytester)
    assert pytester.runpytest("--tokenstate-spec-tests", "-p", "no:randomly").ret == 0
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    tests.write_text("import no_such_module\n" + tests.read_text())
    pytester.runpytest("--tokenstate-spec-tests", "-p", "no:randomly")
    assert {e["id"]: e["last_result"] for e in ledger(pytester)["items"]} == {"D-1": None, "D-2": None}


def test_a_spec_test_whose_xdist_worker_crashed_is_an_error_not_its_last_result(pytester):
    make_project(pytester)
    assert pytester.runpytest("-p", "no:randomly").ret == 0
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    tests.write_text(tests.read_text().replace("    with pytest.raises(ValueError):\n        Guard.check(-1)\n    assert Guard.check(2) == 2", "    import os\n    os._exit(1)", 1))
    pytester.runpytest_subprocess("-n", "2", "-p", "no:randomly")
    assert {e["id"]: e["last_result"] for e in ledger(pytester)["items"]}["D-1"] == "error"


def _edit_paid_test(pytester: pytest.Pytester, old: str, new: str) -> None:
    tests = pytester.path / "specs" / "tests" / "test_demo.py"
    text = tests.read_text()
    assert old in text
    tests.write_text(text.replace(old, new, 1))


def test_a_paid_test_that_fails_on_any_rerun_proves_no_red_before(pytester):
    # the mutant changes nothing; the test fails on a second run for a reason of its own
    make_project(pytester, before="harmless")
    _edit_paid_test(
        pytester, "def test_negative_refused():\n", 'def test_negative_refused(tmp_path):\n    open(tmp_path / "report.json", "x").close()\n'
    )
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*D-1*fails again without its mutant*FileExistsError*re-runnable*"])
    assert entries(pytester)["D-1"]["red_before_verified"] is False


def test_a_mutant_that_no_longer_fits_the_code_it_patches_proves_no_red_before(pytester):
    # the replacement is a callable the patch cannot inspect; the code's call no longer fits it
    make_project(pytester, before="misfit")
    mutant = (
        "import functools\n\n\n"
        '@mutant("D-1/misfit", doc="Replaces Guard.check by a callable that takes no argument.")\n'
        "def misfit(patch):\n"
        '    patch.setattr(Guard, "check", staticmethod(functools.partial(lambda: 0)))\n\n\n'
    )
    _edit_paid_test(pytester, '@pytest.mark.paid("D-1", before=misfit)', mutant + '@pytest.mark.paid("D-1", before=misfit)')
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*red-before not proved: D-1's test fails under it only with TypeError: *takes 0 positional arguments*"
        "mutant D-1/misfit no longer fits the code it patches*"
    ])
    assert entries(pytester)["D-1"]["red_before_verified"] is False


@pytest.mark.parametrize("before", ["negatives_allowed", "harmless"])
def test_a_paid_test_marked_xfail_fails_the_run(pytester, before):
    make_project(pytester, before=before)
    _edit_paid_test(pytester, '@pytest.mark.paid("D-1"', '@pytest.mark.xfail(reason="sometimes")\n@pytest.mark.paid("D-1"')
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*D-1 is paid, but its test is marked xfail*"])
    assert entries(pytester)["D-1"]["last_result"] == ("red-before-lost" if before == "harmless" else "failed")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("def test_negative_refused():\n", 'def test_negative_refused():\n    pytest.skip("not here")\n'),
        ('@pytest.mark.paid("D-1"', '@pytest.mark.skip(reason="not here")\n@pytest.mark.paid("D-1"'),
    ],
    ids=["skip-in-the-body", "skip-mark"],
)
def test_a_skipped_paid_test_fails_the_run(pytester, old, new):
    make_project(pytester)
    _edit_paid_test(pytester, old, new)
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*D-1 is paid, but its test was skipped (*not here)*## Owed*"])
    assert entries(pytester)["D-1"]["last_result"] == "skipped"


def test_an_item_bound_to_a_function_pytest_does_not_collect_fails_the_cross_check(pytester):
    make_project(pytester, spec=SPEC.replace("::test_negative_refused", "::check_negative"))
    _edit_paid_test(pytester, "def test_negative_refused():", "def check_negative():")
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*`tests/test_demo.py::check_negative` is not a test pytest collects*python_functions*"])


def test_a_spec_that_became_malformed_leaves_an_unreadable_ledger(pytester):
    make_project(pytester)
    assert pytester.runpytest("-p", "no:randomly").ret == 0
    spec = pytester.path / "specs" / "demo.md"
    spec.write_text(spec.read_text().replace("# Demo contract", "Demo contract", 1))
    assert pytester.runpytest("-p", "no:randomly").ret != 0
    assert "title" in ledger(pytester)["error"] and ledger(pytester)["items"] == []


def test_a_mutant_that_patches_nothing_is_a_one_line_error(pytester):
    make_project(pytester)
    _edit_paid_test(
        pytester,
        '@pytest.mark.paid("D-1", before=negatives_allowed)',
        '@mutant("D-1/patches-nothing", doc="Forgets to patch.")\ndef patches_nothing(patch):\n'
        '    Guard.check = Guard.check\n\n\n@pytest.mark.paid("D-1", before=patches_nothing)',
    )
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*mutant D-1/patches-nothing patched nothing*"])
    assert "contextlib" not in result.stdout.str() and "plugin.py" not in result.stdout.str()


def test_a_bad_checks_mode_in_the_environment_is_refused_before_any_test_runs(pytester, monkeypatch):
    make_project(pytester)
    monkeypatch.setenv("TOKENSTATE_CHECKS", "bogus")
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*TOKENSTATE_CHECKS='bogus' is not a checks mode; valid values: off, boundary, full*"])
