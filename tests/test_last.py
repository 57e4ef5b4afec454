"""`last` is the newest job launched from this terminal, so that two terminals sharing one
DISTRUN_HOME each stop their own job with the documented `distrun stop last`; a terminal that
launched nothing gets the newest job of DISTRUN_HOME, with a note naming it.

Each terminal here is a real shell in a session of its own (as a terminal window's, a tmux pane's or
an ssh login's is), fed the commands as a person types them; the jobs are real, run by the local
backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

TIMEOUT = 120


class Terminal:
    """A shell in a session of its own; `type` runs one command line in it, as typed there."""

    def __init__(self, env: dict[str, str], scratch: Path) -> None:
        self.scratch = scratch
        self.shell = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, cwd=REPO, env=env, text=True,
                                      start_new_session=True)
        self.count = 0

    def type(self, line: str) -> tuple[int, str, str]:
        """Run `line`; its exit code, stdout and stderr."""
        self.count += 1
        out, err = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.err"
        assert self.shell.stdin is not None and self.shell.stdout is not None
        self.shell.stdin.write(f"{line} >{out} 2>{err} </dev/null; echo $?\n")
        self.shell.stdin.flush()
        code = int(self.shell.stdout.readline())
        return code, out.read_text(), err.read_text()

    def close(self) -> None:
        self.shell.kill()
        self.shell.wait()


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[list[Terminal]]:
    script = tmp_path / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(300)\n")
    (tmp_path / "job.yaml").write_text(f"name: sleepy\nscript: {script}\nnproc_per_node: 1\nbackend: local\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "DISTRUN_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
           "OMP_NUM_THREADS": "1"}
    env.pop("DISTRUN_INVENTORY", None)
    made = []
    for name in "abc":
        (tmp_path / name).mkdir()
        made.append(Terminal(env, tmp_path / name))
    yield made
    made[0].type("python -m orchestrator stop --all")
    for terminal in made:
        terminal.close()


def state(terminal: Terminal, job_id: str) -> str:
    code, out, err = terminal.type("python -m orchestrator ps --json")
    assert code == 0, err
    return next(job["state"] for job in json.loads(out) if job["id"] == job_id)


def test_stop_last_in_each_of_two_terminals_stops_the_job_that_terminal_launched(terminals: list[Terminal],
                                                                                 tmp_path: Path) -> None:
    first, second, other = terminals
    launch = f"python -m orchestrator launch {tmp_path / 'job.yaml'} --detach"
    code, first_job, err = first.type(launch)
    assert code == 0, err
    code, second_job, err = second.type(launch)
    assert code == 0, err
    first_job, second_job = first_job.strip(), second_job.strip()

    code, out, err = first.type("python -m orchestrator stop last --json")

    assert code != 2 and [job["id"] for job in map(json.loads, out.splitlines())] == [first_job], err
    assert "note" not in err
    assert state(other, second_job) == "running"

    code, out, err = second.type("python -m orchestrator stop last --json")
    assert [job["id"] for job in map(json.loads, out.splitlines())] == [second_job], err

    code, out, err = other.type("python -m orchestrator stop last --json")
    assert [job["id"] for job in map(json.loads, out.splitlines())] == [second_job], err
    assert err.strip().splitlines()[0] == (f"distrun: note: `last` is {second_job}, the newest job of "
                                           f"{tmp_path / 'home'}: none was launched from this terminal")
