"""The suite's own setup (tests/conftest.py): what `-m` selects, and a run with a module skipped at collection."""

from __future__ import annotations

import os

import pytest

from tests.helpers import REPO

pytest_plugins = ("pytester",)


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A scratch suite under the project's conftest, run in a subprocess that imports this checkout."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return pytester


def test_tests_that_use_a_lab_are_deselected_by_not_cluster(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_labs="def test_on_a_lab(cluster3):\n    pass\n\n\ndef test_plain():\n    pass\n")
    result = suite.runpytest_subprocess("-m", "not cluster", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_plain*", "1/2 tests collected (1 deselected)*"])


def test_a_module_skipped_at_collection_ends_the_run_without_a_traceback(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_absent="import pytest\n\npytest.importorskip('no_such_module_here')\n",
                     test_present="def test_plain():\n    pass\n")
    result = suite.runpytest_subprocess()
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1, skipped=1)
