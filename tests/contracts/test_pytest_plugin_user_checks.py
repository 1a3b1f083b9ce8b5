"""``--tokenstate-checks-package``: the beartype hook covers the user's own packages, and says so."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

USER_PACKAGE = """
def double(x: int) -> int:
    return 2 * x
"""

USER_TEST = """
import pytest
from beartype.roar import BeartypeCallHintViolation

def test_mistyped_call_into_my_package():
    from myengine import double
    {body}
"""

RAISES = "with pytest.raises(BeartypeCallHintViolation):\n        double('a')"


def _project(pytester, body):
    pytester.mkpydir("myengine").joinpath("__init__.py").write_text(textwrap.dedent(USER_PACKAGE))
    pytester.makepyfile(test_mine=USER_TEST.format(body=body))
    pytester.syspathinsert()


def test_named_package_is_type_checked_and_the_header_says_so(pytester):
    _project(pytester, RAISES)
    result = pytester.runpytest_subprocess("--tokenstate-checks-package", "myengine", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["tokenstate: --tokenstate-checks on (beartype import hook for tokenstate, myengine)"]
    )


def test_ini_option_names_packages_for_the_checks_flag(pytester):
    _project(pytester, RAISES)
    pytester.makeini("[pytest]\ntokenstate_checks_packages =\n    myengine\n")
    result = pytester.runpytest_subprocess("--tokenstate-checks", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tokenstate: --tokenstate-checks on (*tokenstate, myengine)"])


def test_without_the_option_nothing_is_checked_and_the_header_is_silent(pytester):
    _project(pytester, "assert double('a') == 'aa'")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "--tokenstate-checks on" not in result.stdout.str()


def test_a_bad_package_name_is_a_usage_error(pytester):
    _project(pytester, RAISES)
    result = pytester.runpytest_subprocess("--tokenstate-checks-package", "my-engine", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tokenstate-checks-package 'my-engine': not a package name; pass an importable dotted name*"])


def test_a_package_name_nothing_answers_to_is_a_usage_error(pytester):
    _project(pytester, RAISES)
    result = pytester.runpytest_subprocess("--tokenstate-checks-package", "myengnie", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tokenstate-checks-package 'myengnie': no package 'myengnie' is installed or importable*"])
