"""`make demo` as a newcomer sees it: each install step announced, and a "what next" line at the end
(read from `make -n`, which prints the recipe without running it)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def recipe(target: str, *variables: str) -> list[str]:
    # Under `make test` this runs in a sub-make, which would print "Entering/Leaving directory" lines.
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, *variables], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_make_demo_announces_every_install_step_and_ends_with_what_to_do_next(tmp_path) -> None:
    lines = recipe("demo", f"VENV={tmp_path / 'venv'}")

    installs = [i for i, line in enumerate(lines) if " -m venv " in line or "pip install" in line]
    assert len(installs) == 4
    assert all(lines[i - 1].startswith("echo \"[") for i in installs), lines
    assert "torch" in lines[installs[2] - 1] and "minute" in lines[installs[2] - 1]
    assert lines[-1].startswith("echo \"Next: ") and "distrun logs last" in lines[-1] and "distrun doctor" in lines[-1]
    assert "copy inventory/example.yaml" in lines[-1], "say where an inventory comes from"


def test_make_demo_installs_what_a_job_needs_not_the_tests_and_without_setuptools_notice(tmp_path) -> None:
    demo = recipe("demo", f"VENV={tmp_path / 'venv'}")
    test = recipe("test", f"VENV={tmp_path / 'venv'}")

    editable = [line for line in demo if "pip install" in line and " -e " in line]
    assert editable == [f"PYTHONWARNINGS=\"ignore:Editable installation\" {tmp_path}/venv/bin/pip install "
                        "--progress-bar on -e '.[train]'"]
    assert not any("test]" in line or "mkdocs" in line for line in demo)
    assert any("-e '.[train,test,deepspeed]'" in line for line in test)


def test_every_target_the_makefile_documents_is_phony() -> None:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    documented = set(re.findall(r"^## ([\w-]+):", text, re.M))
    phony = set(re.search(r"^\.PHONY: (.*)$", text, re.M).group(1).split())

    assert {"demo", "test", "docs"} <= documented <= phony


def test_make_docs_builds_the_site_strictly_into_site() -> None:
    lines = recipe("docs", "TESTS=")

    assert lines == [".venv/bin/mkdocs build --strict --site-dir site"]
