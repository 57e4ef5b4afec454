"""Issue 46.4, pinned on this machine: the directories distrun runs programs from and writes into on a
host (~/.distrun, jobs, jobs/<id>, bin, the node's, sock) are checked for owner and mode before
anything of the job runs, as the socket directory is. One that another user (uid 65534, as on the lab
hosts) made or can write refuses the job in one line (the path, what is wrong, the fix), exit 2,
and the program planted there never runs."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from orchestrator.remote.safedirs import UnsafeDirError, make_job_dirs
from tests.helpers import distrun
from tests.test_security_round2 import IMPOSTOR_UID
from tests.test_supervisor_lifecycle import config, run_shipped

PLANTED = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran as the operator')\n"


def theirs(path: Path) -> None:
    """`path` made by another user first, open to everyone (as the attacker of issue 46.4 left it)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    os.chown(path, IMPOSTOR_UID, IMPOSTOR_UID)


def plant(host: Path, job_id: str, node: str, how: str) -> tuple[Path, str]:
    """Make one of the job's directories unsafe; the directory and the words its refusal must say."""
    jobs, job = host / "jobs", host / "jobs" / job_id
    if how == "jobs writable by all":
        jobs.mkdir(parents=True)
        jobs.chmod(0o1777)
        return jobs, "can be written by group or others (mode 1777)"
    if how == "bin made by another user":
        job.mkdir(parents=True, mode=0o700)
        theirs(job / "bin")
        return job / "bin", f"belongs to uid {IMPOSTOR_UID}, not to you"
    if how == "node dir made by another user":
        job.mkdir(parents=True, mode=0o700)
        theirs(job / node)
        return job / node, f"belongs to uid {IMPOSTOR_UID}, not to you"
    if how == "sock a link":
        job.mkdir(parents=True, mode=0o700)
        (job / "sock").symlink_to(host.parent)
        return job / "sock", "is a symbolic link"
    host.parent.mkdir(parents=True, exist_ok=True)  # ~/.distrun a link to another user's directory
    theirs(host.parent / "elsewhere")
    host.symlink_to(host.parent / "elsewhere")
    return host, "is a symbolic link"


HOWS = ["jobs writable by all", "bin made by another user", "node dir made by another user", "sock a link",
        "~/.distrun a link"]


@pytest.mark.parametrize("how", HOWS)
def test_the_supervisor_refuses_a_job_whose_host_directory_is_unsafe_before_anything_runs(
        tmp_path: Path, how: str) -> None:
    ran = tmp_path / "ran"
    cfg = config(tmp_path, [])
    host = Path(cfg["host_dir"])
    bad, words = plant(host, cfg["job_id"], "n0", how)
    program = host / "jobs" / cfg["job_id"] / "bin" / "planted.py"
    if how == "bin made by another user":
        program.write_text(PLANTED)
    cfg["argv"] = [sys.executable, str(program), str(ran)]
    lines, events = run_shipped(cfg)
    end = events[-1]
    assert (end["ev"], end["rc"], end.get("refused"), lines) == ("exit", 2, True, [])
    assert end["error"].startswith(f"host directory {bad} {words}") and "\n" not in end["error"], end["error"]
    assert ("rm " in end["error"]) or ("chmod go-w" in end["error"])  # the fix
    assert not ran.exists()


def test_the_job_directories_are_made_0700_and_a_shared_home_made_by_another_host_passes(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make_job_dirs(str(tmp_path / "h" / ".distrun"), "j-1", "n0")
        make_job_dirs(str(tmp_path / "h" / ".distrun"), "j-1", "n1")  # a second host of a shared home
    finally:
        os.umask(old)
    for made in (".distrun", ".distrun/jobs", ".distrun/jobs/j-1", ".distrun/jobs/j-1/n0", ".distrun/jobs/j-1/n1"):
        assert stat.S_IMODE((tmp_path / "h" / made).stat().st_mode) == 0o700, made


def test_a_directory_above_the_host_directory_that_others_can_write_refuses_too(tmp_path: Path) -> None:
    theirs(tmp_path / "open")
    with pytest.raises(UnsafeDirError, match=f"{tmp_path / 'open'} belongs to uid {IMPOSTOR_UID}.*above distrun"):
        make_job_dirs(str(tmp_path / "open" / ".distrun"), "j-1", "n0")
    assert not (tmp_path / "open" / ".distrun").exists()


def test_a_launch_whose_jobs_directory_anyone_can_write_is_refused_in_one_line_exit_2(tmp_path: Path) -> None:
    """The issue's case through the CLI: `~/.distrun/jobs` made 1777; nothing of the job runs."""
    (tmp_path / ".distrun" / "jobs").mkdir(parents=True, mode=0o700)
    (tmp_path / ".distrun" / "jobs").chmod(0o1777)
    ran = tmp_path / "ran"
    (tmp_path / "job.py").write_text(PLANTED)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: dirs\nscript: {tmp_path / 'job.py'}\nargs: [{json.dumps(str(ran))}]\nnproc_per_node: 1\n")
    home = tmp_path / "home"
    result = distrun("launch", str(job), "--backend", "local", "--no-live", home=home, env={"HOME": str(tmp_path)})
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    jobs = tmp_path / ".distrun" / "jobs"
    assert result.stderr.startswith(f"distrun: error: localhost: host directory {jobs} can be written by group or "
                                    f"others (mode 1777)"), result.stderr
    assert f"chmod go-w {jobs}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not ran.exists() and list(jobs.iterdir()) == []
