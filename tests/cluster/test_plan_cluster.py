"""The plan is what runs: on each of 3 real sshd hosts, `/proc/PID/cmdline` of the job's torchrun is
the argv `--dry-run` showed for that host, word for word (`~` as the host's shell expands it), and
every rank runs distrun's worker entry as that argv says (issue 41, part 2)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys

from tests.helpers import distrun, unique_job_id, wait_for
from tests.test_worker_entry import SHOWS, torchrun

from .test_launch_cluster import inv, output, start, wait_for_line, write_job  # noqa: F401


def dry_run_argv(stdout: str) -> dict[str, list[str]]:
    """Each host's argv from a dry run: the last line of its `[node]` block."""
    blocks = [block for block in stdout.split("\n\n") if block.startswith("[")]
    return {block[1:block.index("]")]: shlex.split(block.splitlines()[-1]) for block in blocks}


def test_each_hosts_torchrun_and_ranks_run_the_dry_runs_argv_byte_for_byte(cluster3, inv, tmp_path):  # noqa: F811
    job_id = unique_job_id("plan-is-truth")
    home = tmp_path / "home"
    # A port of its own: `port: auto` takes the first free one when each probe runs, which another
    # test's job may take between the dry run and the launch.
    job = write_job(tmp_path, "plan", ["--sleep", "120"], extra=f"rendezvous: {{port: {31000 + os.getpid() % 2000}}}\n")
    shown = distrun("launch", str(job), "-i", str(inv), "--dry-run", "--probe", "--job-id", job_id, home=home)
    assert shown.returncode == 0, shown.stderr
    planned = dry_run_argv(shown.stdout)
    assert sorted(planned) == ["node0", "node1", "node2"], shown.stdout
    proc = start(job, inv, home, job_id, "--no-live")
    try:
        wait_for_line(home, job_id, "ALLREDUCE 21")
        for i, node in enumerate(["node0", "node1", "node2"]):
            procs = cluster3.processes_with_env(i, "DISTRUN_JOB_ID", job_id)
            torchrun = [p for p in procs if any(arg.endswith("/distrun_torchrun.py") for arg in p.cmdline)]
            assert len(torchrun) == 1, [p.cmdline for p in procs]
            home_dir = torchrun[0].environ()["HOME"]
            expected = [os.path.join(home_dir, word[2:]) if word.startswith("~/") else word for word in planned[node]]
            assert list(torchrun[0].cmdline) == expected
            entry_at = next(k for k, word in enumerate(expected) if word.endswith("/distrun_worker.py"))
            ranks = [p for p in procs if "RANK" in p.environ() and p.ppid == torchrun[0].pid]
            assert len(ranks) == 2 and all(list(p.cmdline) == [expected[0], "-u", *expected[entry_at:]] for p in ranks)
    finally:
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: proc.poll() is not None, 60), output(home, job_id)[-2000:]


def test_a_rank_on_a_lab_host_sees_and_does_what_it_does_under_plain_torchrun(cluster3, inv, tmp_path):  # noqa: F811
    """The worker entry's transparency on real hosts: 2 hosts x 1 rank of a script that shows its argv,
    __name__, __file__, sys.path[0] and raises; rank 0's stdout and stderr as distrun keeps them are
    what plain torchrun's rank 0 writes on this machine (the same filesystem), traceback included."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "shows.py").write_text(SHOWS)
    plain_out, plain_err, _ = torchrun(tmp_path, "plain", ["sub/shows.py", "raise"])
    job_id = unique_job_id("shows-lab")
    home = tmp_path / "home"
    job = tmp_path / "shows.yaml"
    job.write_text(f"name: shows\nscript: sub/shows.py\nargs: [raise]\nnnodes: 2\nnproc_per_node: 1\n"
                   f"workdir: {tmp_path}\ntelemetry: {{enabled: false}}\n")
    done = distrun("launch", str(job), "-i", str(inv), "--no-live", "--job-id", job_id, home=home, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    ranks = home / "jobs" / job_id / "ranks"
    python = json.loads((home / "jobs" / job_id / "plan.json").read_text())["hosts"][0]["python"]
    assert (ranks / "0.out").read_text() == plain_out.replace(sys.executable, python)
    assert (ranks / "0.err").read_text() == plain_err
