"""The supervisor's output side, run for real as it runs on a host, with a stand-in torchrun.

tests/fake_torchrun lays out each rank's stdout and stderr files as `torchrun --redirects 3
--log-dir` does, without importing torch, so these tests take seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_MODULES, SUPERVISOR_ONLY
from orchestrator.remote.linestore import read_index
from orchestrator.remote.relay import with_log_dir
from orchestrator.remote.stream import Batch, FrameReader
from tests.helpers import REPO

FAKE_TORCHRUN = REPO / "tests" / "fake_torchrun"
SECRET = "tok-271828"


@dataclass
class Seen:
    """What the controller would have read from a supervisor's stdout."""

    batches: list[Batch] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # "batch" / event kinds, in stream order
    loose: list[bytes] = field(default_factory=list)

    def text(self, rank: int | None, stream: str = "o") -> str:
        return b"".join(b.data for b in self.batches if b.rank == rank and b.stream == stream).decode()


def config(tmp_path: Path, script: Path, nproc: int = 2, **extra: object) -> dict:
    return {
        "job_id": "sup-1", "node": "n0", "host_dir": str(tmp_path / "host"), "heartbeat_timeout": None,
        "stop_grace": 1, "telemetry_interval": None, "first_rank": 4, "exact_ranks": True, "attempt": 1,
        # Node rank 4 // nproc: the workers' RANK (from the stand-in torchrun) starts at first_rank 4 too.
        "argv": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                 "--node-rank", str(4 // nproc), "--redirects", "3", str(script)],
        "env": {"TOKEN": SECRET, "PYTHONPATH": str(FAKE_TORCHRUN)}, "secret_names": ["TOKEN"], **extra,
    }


def start(cfg: dict, modules: list[str] = SUPERVISOR_ONLY) -> subprocess.Popen[bytes]:
    payload = remote.bundle("supervisor", modules)
    proc = subprocess.Popen(remote.bootstrap_argv(sys.executable, payload, "sup-test"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(FAKE_TORCHRUN)})
    assert proc.stdin is not None
    proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n")
    proc.stdin.flush()
    return proc


def read_all(proc: subprocess.Popen[bytes], chunk: int = 4096) -> Seen:
    """Everything the supervisor wrote, cut into small chunks as a channel would deliver it."""
    seen = Seen()

    def batch(b: Batch) -> None:
        seen.batches.append(b)
        seen.order.append("batch")

    def event(data: bytes) -> None:
        seen.events.append(json.loads(data))
        seen.order.append(seen.events[-1]["ev"])

    reader = FrameReader(batch, event, seen.loose.append)
    out, _ = proc.communicate(timeout=60)
    for at in range(0, len(out), chunk):
        reader.feed(out[at:at + chunk])
    reader.close()
    return seen


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "worker.py"
    path.write_text("import os, sys, time\nrank = int(os.environ['RANK'])\n" + body)
    return path


def test_each_ranks_lines_arrive_whole_in_order_with_its_global_rank_and_stream(tmp_path: Path) -> None:
    worker = script(tmp_path, "for i in range(20000):\n    print('line', rank, i)\n"
                              "sys.stderr.write(f'done {rank}\\n')\n")
    seen = read_all(start(config(tmp_path, worker)))

    for rank in (4, 5):
        assert seen.text(rank).splitlines() == [f"line {rank} {i}" for i in range(20000)]
        assert seen.text(rank, "e") == f"done {rank}\n"
    assert all(b.nlines == b.data.count(b"\n") and b.data.endswith(b"\n") for b in seen.batches)
    assert "fake torchrun: started 2 worker(s)" in seen.text(None, "e")
    assert not seen.loose


def test_the_exit_comes_after_every_line_and_a_partial_last_line_is_kept_marked(tmp_path: Path) -> None:
    worker = script(tmp_path, "print('first')\nsys.stdout.write('no newline at exit')\nsys.stdout.flush()\n")
    seen = read_all(start(config(tmp_path, worker, nproc=1)))

    assert seen.order[-1] == "exit" and seen.events[-1]["rc"] == 0
    partial = [b for b in seen.batches if b.partial]
    assert [(b.rank, b.data) for b in partial] == [(4, b"no newline at exit\n")]
    assert seen.text(4) == "first\nno newline at exit\n"


def test_a_line_still_without_newline_is_sent_partial_after_a_short_wait(tmp_path: Path) -> None:
    worker = script(tmp_path, "sys.stdout.write('working...')\nsys.stdout.flush()\ntime.sleep(2)\nprint(' done')\n")
    seen = read_all(start(config(tmp_path, worker, nproc=1)))

    assert [(b.data, b.partial) for b in seen.batches if b.rank == 4] == [(b"working...\n", True), (b" done\n", False)]


def test_a_line_printed_before_a_raise_comes_before_the_traceback(tmp_path: Path) -> None:
    worker = script(tmp_path, "print('the last words')\nraise RuntimeError('deliberate')\n")
    seen = read_all(start(config(tmp_path, worker, nproc=1)))

    rank_batches = [b.data.decode() for b in seen.batches if b.rank == 4]
    text = "".join(rank_batches)
    assert text.index("the last words") < text.index("Traceback") < text.index("RuntimeError: deliberate")
    assert seen.events[-1]["rc"] == 1


def test_secret_values_are_masked_in_the_stream_and_the_host_copy_which_keeps_the_same_lines(tmp_path: Path) -> None:
    worker = script(tmp_path, "print('token is', os.environ['TOKEN'])\nsys.stderr.write('err line\\n')\n")
    seen = read_all(start(config(tmp_path, worker, nproc=1)))

    copy = tmp_path / "host" / "jobs" / "sup-1" / "n0"
    assert seen.text(4) == "token is ***\n"
    assert (copy / "ranks" / "4.out").read_text() == "token is ***\n"
    assert (copy / "ranks" / "4.err").read_text() == "err line\n"
    entries = read_index(str(copy))
    assert {(e.rank, e.stream) for e in entries} >= {(4, "o"), (4, "e"), (None, "e")}
    assert all(e.node == "n0" and e.attempt == 1 for e in entries)
    stored = b"".join(p.read_bytes() for p in copy.rglob("*") if p.is_file())
    assert SECRET.encode() not in stored
    assert not (copy / "torchrun").exists(), "torchrun's own (unmasked) files are removed at the end"


def test_the_host_copy_has_each_line_while_the_job_still_runs(tmp_path: Path) -> None:
    """The copy is what `--recover` reads after a controller was lost: it must not wait for the
    job's end (or a buffer to fill) to hold a line."""
    go = tmp_path / "go"
    worker = script(tmp_path, f"print('early', rank)\nsys.stderr.write('early err\\n')\n"
                              f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\nprint('late')\n")
    proc = start(config(tmp_path, worker, nproc=1))
    copy = tmp_path / "host" / "jobs" / "sup-1" / "n0"
    try:
        assert wait_until(lambda: {(e.rank, e.stream) for e in read_index(str(copy))} >= {(4, "o"), (4, "e")}, 20)
        assert (copy / "ranks" / "4.out").read_text() == "early 4\n"
        assert (copy / "ranks" / "4.err").read_text() == "early err\n"
        assert proc.poll() is None and job_pids("sup-1"), "the job still runs"
    finally:
        go.touch()
    seen = read_all(proc)

    assert seen.text(4) == "early 4\nlate\n"
    assert (copy / "ranks" / "4.out").read_text() == "early 4\nlate\n"


def test_events_go_out_ahead_of_a_flood_that_the_controller_has_not_read(tmp_path: Path) -> None:
    """While nobody reads stdout, the lines wait in the supervisor's queue; a heartbeat does not
    wait behind them: it is the next thing written once the write under way completes."""
    # All the lines in one write: they are all queued before the next heartbeat is due.
    worker = script(tmp_path, "sys.stdout.write(''.join(f'flood {rank} {i} ' + 'x' * 60 + '\\n'\n"
                              "                         for i in range(120000)))\ntime.sleep(2)\n")
    proc = start(config(tmp_path, worker, nproc=1))
    time.sleep(4)  # stdout unread: its pipe is full, the supervisor's queue holds the rest
    seen = read_all(proc, chunk=65536)

    sizes = iter(len(b.data) for b in seen.batches)
    before, total, first_batch = 0, sum(len(b.data) for b in seen.batches), seen.order.index("batch")
    for kind in seen.order[first_batch:]:
        if kind == "hb":
            break
        before += next(sizes) if kind == "batch" else 0
    assert before < 3 << 20 < total, f"the first heartbeat after the flood began came behind {before} bytes of lines"
    assert seen.text(4).count("\n") == 120000


def test_telemetry_samples_taken_during_a_flood_go_out_ahead_of_its_lines(tmp_path: Path) -> None:
    """Samples are taken and sent on time while the lines of a flood wait for the controller, so
    that a flood never reads as a host whose telemetry went silent."""
    worker = script(tmp_path, "sys.stdout.write(''.join(f'flood {rank} {i} ' + 'x' * 60 + '\\n'\n"
                              "                         for i in range(120000)))\ntime.sleep(2)\n")
    proc = start(config(tmp_path, worker, nproc=1, telemetry_interval=0.5), SUPERVISOR_MODULES)
    time.sleep(4)  # stdout unread: the flood waits in the pipe and the supervisor's queue
    seen = read_all(proc, chunk=65536)

    sizes = iter(len(b.data) for b in seen.batches)
    ahead, lines_before = 0, 0
    for kind in seen.order:
        if kind == "tel":
            ahead += 1
        elif kind == "batch":
            lines_before += next(sizes)
            if lines_before > 3 << 20:
                break
    # About 7 samples in the 4 s stdout was unread; all of them ahead of the flood's last megabytes.
    assert ahead >= 4, f"only {ahead} sample(s) came before the first 3 MiB of lines: {seen.order[:40]}"
    assert seen.text(4).count("\n") == 120000


def test_the_watchdog_ends_a_flooding_job_whose_controller_stopped_reading_and_stopped_beating(tmp_path: Path) -> None:
    worker = script(tmp_path, "while True:\n    print('flood', rank, 'x' * 70)\n")
    proc = start(config(tmp_path, worker, nproc=2, heartbeat_timeout=2))
    began = time.monotonic()
    try:
        time.sleep(1)  # nothing reads stdout and no heartbeat is sent, as with a SIGSTOPped controller
        gone = wait_until(lambda: not job_pids("sup-1"), 15)
        assert gone, "the job must end within heartbeat_timeout + stop_grace although stdout is never read"
        assert time.monotonic() - began < 2 + 1 + 6
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for pid in job_pids("sup-1"):
            os.kill(pid, signal.SIGKILL)


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def job_pids(job_id: str) -> list[int]:
    """Processes of the job (by DISTRUN_JOB_ID in their environment), as the fault tests find them."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if f"DISTRUN_JOB_ID={job_id}".encode() in env and state != b"Z":
            found.append(int(entry))
    return found


def test_under_c10d_each_workers_global_rank_is_the_one_torchrun_gave_it(tmp_path: Path) -> None:
    """c10d assigns ranks at rendezvous: the plan's first rank (0 here) is only a guess; the
    supervisor reads the RANK torchrun gave each worker (4 and 5 here)."""
    worker = script(tmp_path, "print('I am', rank)\ntime.sleep(1)\n")
    seen = read_all(start(config(tmp_path, worker, first_rank=0, exact_ranks=False)))

    assert (seen.text(4), seen.text(5)) == ("I am 4\n", "I am 5\n")


def test_torchrun_gets_the_log_dir_whether_it_runs_with_dash_p_or_through_the_c_line() -> None:
    for dash_p in (True, False):  # -P where the host's python is known to have it; else (Slurm) the -c line
        argv = [*remote.module_argv("/usr/bin/python3", "torch.distributed.run", dash_p), "--nnodes", "2", "train.py"]
        assert with_log_dir(argv, "/d") == [*argv[:-3], "--log-dir", "/d", "--nnodes", "2", "train.py"]
    assert with_log_dir(["bash", "run.sh"], "/d") == ["bash", "run.sh"]


def test_the_plans_log_dir_is_kept_and_a_plan_without_one_gets_it_after_the_program() -> None:
    """The plan names torchrun's --log-dir (ssh, local); Slurm's cannot (the node is named when
    the job runs), and the supervisor adds it there."""
    program = "/h/.distrun/jobs/j/bin/distrun_torchrun.py"
    planned = ["python3", "-P", program, "--log-dir", "/d", "--nnodes", "2", "train.py"]
    assert with_log_dir(planned, "/d") == planned
    assert with_log_dir(["python3", program, "--nnodes", "2"], "/d") == ["python3", program, "--log-dir", "/d",
                                                                          "--nnodes", "2"]


def test_a_secret_inside_a_line_longer_than_line_max_is_masked_across_the_cut(tmp_path: Path) -> None:
    """One write of 1.25 MiB of A (less 4 bytes: the secret straddles a read), the secret, then 10 MiB of
    B: the line is cut past LINE_MAX, and neither part of the secret is left in the stream or the host copy."""
    worker = script(tmp_path, "sys.stdout.write('A' * ((5 << 18) - 4) + os.environ['TOKEN'] + 'B' * (10 << 20)"
                              " + '\\n')\n")
    seen = read_all(start(config(tmp_path, worker, nproc=1)), chunk=1 << 20)
    copy = (tmp_path / "host" / "jobs" / "sup-1" / "n0" / "ranks" / "4.out").read_text()
    for text in (seen.text(4), copy):
        assert len([b for b in seen.batches if b.rank == 4 and b.partial]) > 1
        assert text.replace("\n", "") == "A" * ((5 << 18) - 4) + "***" + "B" * (10 << 20)
        assert SECRET[:5] not in text and SECRET[5:] not in text
