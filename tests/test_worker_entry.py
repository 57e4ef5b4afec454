"""distrun's worker entry (remote/distrun_worker.py) is invisible to the program it runs: under a
real torchrun, a script that shows its sys.argv, __name__, __file__, sys.path[0], stdout and stderr
and then raises, exits with a code or dies by a signal gives the same rank output and the same
worker record as under plain torchrun; spawned workers (multiprocessing, DataLoader) re-import the
script, not the entry; and every rank serves its Flight Recorder without opting in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.remote.flightrec import fetch
from orchestrator.remote.workerfail import read_records
from tests.helpers import distrun

PROGRAMS = Path(remote.__file__).parent
ENTRY = str(PROGRAMS / remote.WORKER_PROGRAM)
TORCHRUN = [sys.executable, "-P", str(PROGRAMS / remote.TORCHRUN_PROGRAM)]
FAKE_TORCH = Path(__file__).parent / "fake_torchrun"

SHOWS = """\
import os, sys
print("argv", sys.argv, "name", __name__, "file", __file__, "path0", sys.path[0])
print("orig", sys.orig_argv[1:], "main", sys.modules["__main__"].__file__, sorted(vars()))
print("to stderr", file=sys.stderr)

def fail(how):
    if how == "raise":
        raise ValueError("boom from " + os.environ["RANK"])
    if how == "exit":
        sys.exit(7)
    if how == "kill":
        os.kill(os.getpid(), 9)

fail(sys.argv[1])
"""

SPAWNS = """\
import multiprocessing as mp, sys
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return i * i

def child(queue):
    queue.put((__name__, sys.argv))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print("child saw", queue.get())
    proc.join()
    loader = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    print("batches", [batch.tolist() for batch in loader])
"""


def torchrun(tmp_path: Path, run: str, target: list[str], *,
             env: dict[str, str] | None = None) -> tuple[str, str, list[tuple[int, str]]]:
    """One worker under a real torchrun (distrun's program, for its records): its stdout, stderr
    and torchrun's record of it (exit code, message) when it failed."""
    logs = tmp_path / run
    argv = [*TORCHRUN, "--log-dir", str(logs), "--standalone", "--nproc-per-node", "1", "--redirects", "3",
            *target]
    subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=180, env={**os.environ, **(env or {})})
    (stdout,) = logs.glob("*/attempt_0/0/stdout.log")
    records = [(r.exitcode, r.message.split(" received by PID")[0]) for r in read_records(str(logs / "failures.json"))]
    return stdout.read_text(), (stdout.parent / "stderr.log").read_text(), records


@pytest.mark.parametrize("how", ["raise", "exit", "kill"])
def test_a_script_sees_and_does_the_same_under_the_entry_as_under_plain_torchrun(tmp_path, how):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "shows.py").write_text(SHOWS)
    plain = torchrun(tmp_path, "plain", ["sub/shows.py", how])
    entry = torchrun(tmp_path, "entry", [ENTRY, "sub/shows.py", how])
    assert entry == plain
    stdout, stderr, records = entry
    assert f"argv ['sub/shows.py', '{how}'] name __main__ file {tmp_path}/sub/shows.py path0 {tmp_path}/sub" in stdout
    assert stderr.startswith("to stderr\n")
    assert records == [{"raise": (1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
                        "exit": (7, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
                        "kill": (-9, "Signal 9 (SIGKILL)")}[how]]
    if how == "raise":
        assert stderr.splitlines()[1:] == [
            "Traceback (most recent call last):",
            f'  File "{tmp_path}/sub/shows.py", line 14, in <module>', "    fail(sys.argv[1])",
            f'  File "{tmp_path}/sub/shows.py", line 8, in fail',
            '    raise ValueError("boom from " + os.environ["RANK"])',
            "ValueError: boom from 0"]


def test_a_module_sees_the_same_under_the_entry_as_under_plain_torchrun_dash_m(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "shows.py").write_text(SHOWS)
    plain = torchrun(tmp_path, "plain", ["-m", "pkg.shows", "raise"])
    entry = torchrun(tmp_path, "entry", [ENTRY, "-m", "pkg.shows", "raise"])
    assert entry == plain
    assert f"path0 {tmp_path}" in entry[0] and "'-m', 'pkg.shows'" in entry[0]


def test_spawned_processes_and_dataloader_workers_reimport_the_script_not_the_entry(tmp_path):
    (tmp_path / "spawns.py").write_text(SPAWNS)
    plain = torchrun(tmp_path, "plain", ["spawns.py"])
    entry = torchrun(tmp_path, "entry", [ENTRY, "spawns.py"])
    assert entry == plain
    assert entry[0] == "child saw ('__mp_main__', ['spawns.py'])\nbatches [[0, 1], [4, 9]]\n"


def test_a_rank_serves_its_flight_recorder_without_opting_in(tmp_path):
    """The script never calls worker_main(): the entry serves it on $DISTRUN_WORKER_SOCKETS/rank<RANK>.sock
    (over a socket an earlier attempt left there) once the script has imported torch, and leaves no
    TORCH_WORKER_SERVER_SOCKET in its environment."""
    sockets = Path("/tmp") / f"dw-{os.getpid()}"
    sockets.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as stale:  # an earlier attempt's socket, left behind: served over
        stale.bind(str(sockets / "rank5.sock"))
    script = tmp_path / "collectives.py"
    script.write_text("import os, sys, torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
                      "for _ in range(3):\n    dist.all_reduce(torch.ones(1))\n"
                      "print('ready', 'TORCH_WORKER_SERVER_SOCKET' in os.environ, flush=True)\nsys.stdin.read()\n")
    env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "RANK": "5", "TORCH_FR_BUFFER_SIZE": "100"}
    rank = subprocess.Popen([sys.executable, "-u", ENTRY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready False"
        got = fetch(str(sockets / "rank5.sock"))
    finally:
        rank.kill()
        _, stderr = rank.communicate()
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
    entries = got["flight"]["entries"]  # type: ignore[index]
    seen = [(e["collective_seq_id"], e["profiling_name"]) for e in entries]
    assert seen == [(i, "gloo:all_reduce") for i in (1, 2, 3)]
    assert "WorkerServer" not in stderr  # torch's server's own lines are not the program's


def test_programs_that_end_right_after_importing_torch_end_while_the_server_starts(tmp_path):
    """torch's server shut down before its thread serves is never stopped, and the rank waited
    for it for ever (CI, 11-27: a rank that raised at start hung its job). Eight at once on two
    cores: without the wait for the server, most of them hung."""
    script = tmp_path / "quick.py"
    script.write_text("import torch\nraise SystemExit(3)\n")
    dirs = [Path("/tmp") / f"dw-{os.getpid()}-{i}" for i in range(8)]
    ranks = []
    for sockets in dirs:
        sockets.mkdir(mode=0o700)
        env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "RANK": "0"}
        ranks.append(subprocess.Popen([sys.executable, "-u", ENTRY, str(script)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        codes = [rank.wait(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
        for sockets in dirs:
            for leftover in sockets.iterdir():
                leftover.unlink()
            sockets.rmdir()
    assert codes == [3] * 8


def test_a_forked_child_that_runs_to_the_end_leaves_its_parent_serving(tmp_path):
    """A child of os.fork() that ends as the program does (no os._exit) shut the server it shares
    with its parent down: the parent's server thread then aborted the parent (exit 134)."""
    sockets = Path("/tmp") / f"dw-{os.getpid()}-fork"
    sockets.mkdir(mode=0o700)
    script = tmp_path / "forks.py"
    script.write_text("import os, sys, torch\npid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\n"
                      "    print('ready', flush=True)\n    sys.stdin.read()\n")
    env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "RANK": "0"}
    rank = subprocess.Popen([sys.executable, "-u", ENTRY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        got = fetch(str(sockets / "rank0.sock"))
        _, stderr = rank.communicate("", timeout=60)
        # What the rank left as it ended (rank0.last.json) is the host's poller's to read and remove.
        left = [path for path in sockets.iterdir() if not path.name.endswith(".last.json")]
        last = json.loads((sockets / "rank0.last.json").read_text())
    finally:
        rank.kill()
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
    assert "flight" in got
    assert (rank.returncode, stderr) == (0, "")
    assert left == []  # the rank removed its socket as it ended (issue 46.9: dead sockets stayed in sock/)
    assert "pg_status" in last  # its own Flight Recorder record as it ended


def test_a_torch_without_the_control_plane_runs_the_program_unchanged(tmp_path):
    script = tmp_path / "old.py"
    script.write_text("import torch, sys\nprint('ran', sorted(m for m in sys.modules if m.startswith('torch')))\n")
    env = {**os.environ, "PYTHONPATH": str(FAKE_TORCH), "DISTRUN_WORKER_SOCKETS": str(tmp_path), "RANK": "0"}
    plain = subprocess.run([sys.executable, "-u", str(script)], env=env, capture_output=True, text=True, timeout=60)
    entry = subprocess.run([sys.executable, "-u", ENTRY, str(script)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert (entry.returncode, entry.stdout, entry.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert plain.stdout.startswith("ran ['torch'")


def test_a_syntax_error_and_a_missing_script_read_as_python_itself_says_them(tmp_path):
    (tmp_path / "bad.py").write_text("x = (\n")
    for name in ("bad.py", "missing.py"):
        plain = subprocess.run([sys.executable, "-u", name], cwd=tmp_path, capture_output=True, text=True)
        entry = subprocess.run([sys.executable, "-u", ENTRY, name], cwd=tmp_path, capture_output=True, text=True)
        assert (entry.returncode, entry.stdout, entry.stderr) == (plain.returncode, plain.stdout, plain.stderr)


def under_distrun(tmp_path: Path, script: str, args: list[str]) -> tuple[str, str, list[tuple[int, str | None]]]:
    """One rank of the script launched by distrun (local backend): rank 0's stdout and stderr as the
    job directory keeps them, and rank 0's failure as the record has it (exit code, signal)."""
    home = tmp_path / "home"
    job = tmp_path / "shows.yaml"
    job.write_text(f"name: shows\nscript: {script}\nargs: {json.dumps(args)}\nnproc_per_node: 1\n"
                   f"workdir: {tmp_path}\ntelemetry: {{enabled: false}}\n")
    done = distrun("launch", str(job), "--no-live", "--job-id", "shows-1", home=home, cwd=tmp_path)
    ranks = home / "jobs" / "shows-1" / "ranks"
    record = json.loads(distrun("ps", "--json", "--all", home=home).stdout)[0]
    failed = [(f["exit_code"], f["signal"]) for f in record.get("failures") or [] if f.get("rank") == 0]
    assert done.returncode in (0, 1), done.stderr
    return (ranks / "0.out").read_text(), (ranks / "0.err").read_text(), failed


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_script_launched_by_distrun_sees_and_does_what_it_does_under_plain_torchrun(tmp_path, how):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "shows.py").write_text(SHOWS)
    plain_out, plain_err, plain_failed = torchrun(tmp_path, "plain", ["sub/shows.py", how])
    out, err, failed = under_distrun(tmp_path, "sub/shows.py", [how])
    assert (out, err) == (plain_out, plain_err)
    assert failed == {"raise": [(1, None)], "kill": [(None, "SIGKILL")]}[how]
    assert plain_failed[0][0] == {"raise": 1, "kill": -9}[how]


OWN_ENTRY_SETUP = ("path = os.path.join(os.environ['DISTRUN_WORKER_SOCKETS'], 'rank' + os.environ['RANK'] + '.sock')\n"
                   "if os.path.exists(path):\n    os.remove(path)\n"
                   "os.environ['TORCH_WORKER_SERVER_SOCKET'] = path\n")
OWN_ENTRY_IMPORTS = ("import torch, torch.distributed as dist\n"
                     "from torch.distributed.elastic.control_plane import worker_main\n")
OWN_ENTRY_MAIN = ("with worker_main():\n"
                  "    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
                  "    for _ in range(3):\n        dist.all_reduce(torch.ones(1))\n"
                  "    print('ready', flush=True)\n    sys.stdin.read()\n"
                  "print('done', flush=True)\n")


@pytest.mark.parametrize("order", ["torch imported first", "socket set up before torch is imported"])
def test_a_script_that_enters_worker_main_itself_serves_on_the_ranks_socket_whatever_its_import_order(
        tmp_path, order):
    """The opt-in jobs/README.md once described (remove the socket, set TORCH_WORKER_SERVER_SOCKET, enter
    worker_main()) on the entry's own socket: the entry yields the socket to the script's server, in
    either order (issue 46.6: set up before torch was imported, it failed with `... already exists`)."""
    sockets = Path("/tmp") / f"dw-{os.getpid()}-own"
    sockets.mkdir(mode=0o700)
    body = (OWN_ENTRY_IMPORTS + OWN_ENTRY_SETUP if order == "torch imported first"
            else OWN_ENTRY_SETUP + OWN_ENTRY_IMPORTS)
    script = tmp_path / "own.py"
    script.write_text("import os, sys\n" + body + OWN_ENTRY_MAIN)
    env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "RANK": "2", "TORCH_FR_BUFFER_SIZE": "100"}
    rank = subprocess.Popen([sys.executable, "-u", ENTRY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert rank.stdout is not None
        ready = rank.stdout.readline().strip()
        got = fetch(str(sockets / "rank2.sock")) if ready == "ready" else {}
        out, stderr = rank.communicate("", timeout=60)
    finally:
        rank.kill()
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
    assert (ready, rank.returncode, out) == ("ready", 0, "done\n"), stderr
    assert "Traceback" not in stderr and "Server listening to UNIX" in stderr  # the script's own server's line
    entries = got["flight"]["entries"]  # type: ignore[index]
    seen = [(e["collective_seq_id"], e["profiling_name"]) for e in entries]
    assert seen == [(i, "gloo:all_reduce") for i in (1, 2, 3)]
