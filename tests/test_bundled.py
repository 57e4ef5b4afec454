"""`distrun examples`: the example jobs that ship in the package, copied out to run from anywhere."""

from __future__ import annotations

import subprocess

from tests.helpers import REPO, distrun


def repo_jobs() -> dict[str, bytes]:
    listed = subprocess.run(["git", "ls-files", "jobs"], cwd=REPO, capture_output=True, text=True, check=True)
    return {path.removeprefix("jobs/"): (REPO / path).read_bytes() for path in listed.stdout.split()}


def test_examples_copies_every_file_of_jobs_into_a_jobs_directory_here(tmp_path):
    result = distrun("examples", home=tmp_path / "home", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    copied = {str(p.relative_to(tmp_path / "jobs")): p.read_bytes()
              for p in (tmp_path / "jobs").rglob("*") if p.is_file()}
    assert copied == repo_jobs()
    assert result.stdout == f"copied {len(copied)} files to jobs/ (see jobs/README.md)\n"


def test_examples_never_overwrites_a_file_and_says_so_in_one_line(tmp_path):
    (tmp_path / "mine" / "compare").mkdir(parents=True)
    (tmp_path / "mine" / "compare" / "ddp.yaml").write_text("my own\n")
    result = distrun("examples", "mine", home=tmp_path / "home", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == ("distrun: error: examples: mine/compare/ddp.yaml exists, and 0 more "
                             "(name a new or an empty directory: distrun examples DIR)\n")
    assert (tmp_path / "mine" / "compare" / "ddp.yaml").read_text() == "my own\n"
    assert sorted(p.name for p in (tmp_path / "mine").rglob("*")) == ["compare", "ddp.yaml"]


def test_a_copied_example_job_runs_from_another_directory_its_script_read_beside_the_job_file(tmp_path):
    home = tmp_path / "home"
    assert distrun("examples", str(tmp_path / "proj" / "jobs"), home=home, cwd=tmp_path).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = distrun("launch", str(tmp_path / "proj" / "jobs" / "tiny.yaml"), "--backend", "local",
                     "--nproc-per-node", "1", "--no-live", "--", "--steps", "2", home=home, cwd=elsewhere)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "succeeded" in result.stdout
