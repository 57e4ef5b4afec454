"""The plan is what a host runs: the supervisor writes the programs a plan's argv names to the job's
bin/, expands `~` in the job directory's words as a shell would, and starts torchrun with exactly
that argv; each worker runs distrun's worker entry as the plan says (`/proc/PID/cmdline` of both)."""

from __future__ import annotations

import json
import os
import socket
import sys

from orchestrator.backends.ssh import plan_supervisor_config
from orchestrator.plan import build_plan
from orchestrator.remote.programs import expand_job_words
from orchestrator.spec import inventory_from_text, job_from_text
from tests.test_supervisor_lifecycle import run_shipped

SHOWS = """\
import json, os
def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return [word.decode() for word in fh.read().split(b"\\0")[:-1]]
print("CMDLINES", json.dumps({"torchrun": cmdline(os.getppid()), "worker": cmdline(os.getpid())}))
if os.environ["RANK"] == "1":
    raise ValueError("rank 1 says no")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_supervisor_runs_the_plans_argv_byte_for_byte_with_the_programs_it_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the host's ~, where ~/.distrun/jobs/<id>/bin goes
    script = tmp_path / "shows.py"
    script.write_text(SHOWS)
    job = job_from_text(f"name: p\nscript: {script}\nnproc_per_node: 2\n", str(tmp_path / "job.yaml"))
    inventory = inventory_from_text(f"nodes:\n  - {{name: n0, host: 127.0.0.1, python: {sys.executable}}}\n", "i.yaml")
    plan = build_plan(job, list(inventory.nodes), {}, job_id="prog-1", inventory_path="i.yaml",
                      master=inventory.nodes[0], master_addr="127.0.0.1", master_port=free_port(),
                      controller_cwd=str(tmp_path), controller_env={}, backend="local")
    host = plan.hosts[0]
    cfg = {**plan_supervisor_config(plan, host).to_dict(), "heartbeat_timeout": None, "telemetry_interval": None}
    lines, events = run_shipped(cfg)

    expanded = [word.replace("~", str(tmp_path), 1) if word.startswith("~/") else word for word in host.argv]
    shown = [line.split(" ", 1)[1] for line in lines if line.startswith("CMDLINES ")]
    assert len(shown) == 2, lines[-20:]
    for seen in map(json.loads, shown):
        assert seen["torchrun"] == expanded
        assert seen["worker"] == [sys.executable, "-u", f"{tmp_path}/.distrun/jobs/prog-1/bin/distrun_worker.py",
                                  str(script)]
    (end,) = [event for event in events if event["ev"] == "exit"]
    assert [(w["rank"], w["exitcode"]) for w in end["workers"]] == [(1, 1)]  # distrun_torchrun.py's records
    assert sorted(os.listdir(tmp_path / ".distrun/jobs/prog-1/bin")) == ["distrun_torchrun.py", "distrun_worker.py"]


def test_only_the_job_directorys_words_get_their_tilde_expanded(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    argv = ["python", "~/.distrun/jobs/j-1/bin/distrun_torchrun.py", "~/data", "~/.distrun/jobs/j-10/x"]
    assert expand_job_words(argv, "~/.distrun/jobs/j-1") == [
        "python", "/home/u/.distrun/jobs/j-1/bin/distrun_torchrun.py", "~/data", "~/.distrun/jobs/j-10/x"]
    assert expand_job_words(argv, "/abs/jobs/j-1") == argv
