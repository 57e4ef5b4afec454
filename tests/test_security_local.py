"""Issue 14 on the built-in local inventory: one real launch, tried as a hostile local user would.

The job runs from a working directory where another user planted `json.py` and `torch/`, under
umask 022, detached (so distrun starts a Python of its own for the controller), and prints its
secret before it fails. Each test reads one promise of docs/security.md off that one launch.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import distrun, plant_module

SECRET = "sekrit-0451-leaky"
JOB_ID = "leak-1"
SCRIPT = """\
import os, sys
sys.stdout.write(f"the token is {os.environ['TOKEN']}\\n")
sys.stdout.flush()
sys.exit(3)
"""


class Launched:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"  # DISTRUN_HOME: the controller's job directories and database
        self.user_home = root / "user"  # HOME: where the host side keeps its copy (~/.distrun)
        self.work = root / "work"  # the job's workdir and the cwd of `distrun launch`
        self.marker = root / "planted-imports.txt"

    @property
    def host_copy(self) -> Path:
        return self.user_home / ".distrun" / "jobs" / JOB_ID

    def record(self) -> dict:
        result = distrun("ps", "--json", "--all", home=self.home)
        return next(r for r in json.loads(result.stdout) if r["id"] == JOB_ID)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    run = Launched(tmp_path_factory.mktemp("hostile"))
    run.user_home.mkdir()
    plant_module(run.work, "json", run.marker)
    plant_module(run.work, "torch", run.marker)
    script = run.root / "scripts" / "leak.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    job = run.root / "leak.yaml"
    job.write_text(f"name: leak\nscript: {script}\nworkdir: {run.work}\nnproc_per_node: 1\n"
                   "env: {TOKEN: '${env:LEAK_SOURCE}'}\ntelemetry: {interval: 0.5}\nstop_grace: 2\n")
    env = {**os.environ, "DISTRUN_HOME": str(run.home), "HOME": str(run.user_home), "LEAK_SOURCE": SECRET,
           "OMP_NUM_THREADS": "1"}
    env.pop("DISTRUN_INVENTORY", None)
    # The console script, as a user runs it: `python -m orchestrator` would itself put the cwd first.
    command = [str(Path(sys.executable).with_name("distrun")), "launch", str(job), "--detach", "--job-id", JOB_ID]
    started = subprocess.run(command, cwd=run.work, env=env, capture_output=True, text=True, timeout=120,
                             umask=0o022, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    deadline = time.monotonic() + 120
    while run.record()["state"] in ("pending", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
    return run


def test_no_python_distrun_starts_imports_modules_planted_in_the_working_directory(launched: Launched) -> None:
    record = launched.record()
    assert record["state"] == "failed", record
    # The detached controller, the probe, the supervisor and torchrun all ran in the planted directory.
    imported = launched.marker.read_text() if launched.marker.exists() else ""
    assert imported == ""


def test_job_directory_database_logs_and_host_copy_are_private_under_umask_022(launched: Launched) -> None:
    paths = [launched.home, *launched.home.rglob("*"), launched.user_home / ".distrun",
             *(launched.user_home / ".distrun").rglob("*")]
    assert launched.host_copy / "localhost" / "lines.idx" in paths and launched.home / "distrun.db" in paths
    assert launched.home / "jobs" / JOB_ID / "telemetry.jsonl" in paths
    opened = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths
              if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert opened == {}


def test_a_secret_the_job_printed_is_masked_in_the_summary_the_record_and_the_report(launched: Launched) -> None:
    record = launched.record()
    root = record["failures"][0]
    assert root["exit_code"] == 3 and "the token is ***" in root["last_lines"], root
    assert "the token is ***" in record["detail"]
    summary = (launched.home / "jobs" / JOB_ID / "summary.txt").read_text()
    assert "the token is ***" in summary
    report = launched.root / "report.html"
    made = distrun("report", JOB_ID, "-o", str(report), home=launched.home)
    assert made.returncode == 0, made.stderr
    for text in (json.dumps(record), summary, report.read_text()):
        assert SECRET not in text
