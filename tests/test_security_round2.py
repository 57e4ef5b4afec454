"""Issue 30's findings, each pinned on this machine: stacks kept masked and private, a secret split
at LINE_MAX masked across the cut, the socket directory's fallback neither blocked nor redirected,
an unsafe checkpoint_dir refused, and processes proven the job's before anything believes them.
tests/cluster/test_impostor_cluster.py runs the impostor as a second user on real hosts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from orchestrator.diagnose.watchdog import diagnose
from orchestrator.fanout.group import GroupResult
from orchestrator.remote import cleanup, provenance
from orchestrator.remote import stack as remote_stack
from orchestrator.remote.flightrec import fetch
from orchestrator.remote.redact import Masker
from orchestrator.remote.safedirs import UnsafeDirError, make_safe_dir
from orchestrator.remote.supervisor import job_processes
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun, ready_processes, record_this_process_as_the_jobs_root
from tests.test_supervisor_lifecycle import config, run_shipped

SECRET = "hunter2-SECRET-value-xyz"


class AnsweringBackend:
    """A backend whose hosts answer `stack` with a fixed JSON line (what remote/stack.py prints)."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        return GroupResult({node: json.dumps(self.answer) + "\n" for node in nodes})


def frame(name: str) -> dict[str, object]:
    return {"name": name, "filename": "/w/train.py", "short_filename": "train.py", "line": 9}


def hung_answer() -> dict[str, object]:
    """Two ranks, rank 1 elsewhere in a function whose name carries the secret; both dumps carry it."""
    dump = {"entries": [{"collective_seq_id": 1, "profiling_name": f"gloo:{SECRET}",
                         "process_group": ["0", "default_pg"], "state": "scheduled"}]}
    return {"pyspy": "/usr/bin/py-spy", "ranks": [
        {"rank": 0, "local_rank": 0, "pid": 10, "threads": [{"thread_name": "MainThread",
                                                             "frames": [frame("wait_in_collective")]}],
         "flight": dump},
        {"rank": 1, "local_rank": 1, "pid": 11, "threads": [{"thread_name": "MainThread",
                                                             "frames": [frame(f"load_{SECRET}")]}],
         "flight": dump, "flight_seconds": 0.1}]}


def test_a_secret_in_a_hangs_stacks_and_dumps_is_masked_in_the_failure_and_every_kept_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    rec = JobRecord(id="sec-1", name="sec", spec_path="x.yaml", inventory="<built-in>", hosts=["node0"],
                    backend="ssh", state=JobState.RUNNING)
    store.save(rec)
    job_dir = store.job_dir(rec.id)
    failure = diagnose(AnsweringBackend(hung_answer()), rec, job_dir, 15,  # type: ignore[arg-type]
                       {"node0": "10.0.0.1"}, Masker([SECRET]))
    assert "load_***" in "\n".join(failure.stack)
    assert SECRET not in json.dumps(failure.to_dict())
    kept = [*job_dir.stacks.iterdir(), *job_dir.flight.iterdir()]
    assert {p.name for p in kept} >= {"rank1.txt", "stacks.json", "folded.txt", "rank0.json", "flight.json"}
    for path in kept:
        assert SECRET not in path.read_text(), path.name


def test_kept_stacks_and_flight_dumps_are_private_under_umask_000(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    rec = JobRecord(id="sec-2", name="sec", spec_path="x.yaml", inventory="<built-in>", hosts=["node0"],
                    backend="ssh", state=JobState.RUNNING)
    store.save(rec)
    job_dir = store.job_dir(rec.id)
    old = os.umask(0)
    try:
        diagnose(AnsweringBackend(hung_answer()), rec, job_dir, 15, {})  # type: ignore[arg-type]
    finally:
        os.umask(old)
    for folder in (job_dir.stacks, job_dir.flight):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder.name
        for path in folder.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


# ---------------------------------------------------------------- processes proven, not claimed

IMPOSTOR_UID = 65534  # nobody: an unprivileged second user on this machine


def as_impostor(argv: list[str]) -> list[str]:
    """argv run as another, unprivileged user."""
    return ["setpriv", f"--reuid={IMPOSTOR_UID}", f"--regid={IMPOSTOR_UID}", "--clear-groups", *argv]


@pytest.fixture
def job_beside_an_impostor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[str]]]:
    """A rank of job imp-1 (a child of this process, recorded as its root, as the supervisor records
    itself) and, beside it, another user's process carrying the job's markers and RANK=7."""
    monkeypatch.setenv("HOME", str(tmp_path))
    record_this_process_as_the_jobs_root(tmp_path, "imp-1", "n0")
    markers = {**os.environ, "DISTRUN_JOB_ID": "imp-1", "DISTRUN_NODE": "n0"}
    sleeper = [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"]
    with ready_processes([(sleeper, {**markers, "RANK": "0", "LOCAL_RANK": "0"}),
                          (as_impostor(sleeper), {**markers, "RANK": "7", "LOCAL_RANK": "1"})]) as procs:
        environ = Path(f"/proc/{procs[1].pid}/environ").read_bytes().split(b"\0")
        assert b"DISTRUN_JOB_ID=imp-1" in environ and b"RANK=7" in environ  # the markers, claimed
        yield procs


def test_another_users_process_with_the_jobs_markers_is_not_a_rank_nor_counted(job_beside_an_impostor) -> None:
    rank = job_beside_an_impostor[0]
    assert [r["pid"] for r in remote_stack.dump_ranks("imp-1", "n0", native=False)["ranks"]] == [rank.pid]
    assert job_processes("imp-1", os.getpid(), "n0") == [rank.pid]


def test_stop_never_signals_another_users_process_with_the_jobs_markers(job_beside_an_impostor, capsys) -> None:
    rank, impostor = job_beside_an_impostor
    cleanup.main(["imp-1", "n0", "1"])
    assert json.loads(capsys.readouterr().out) == {"found": 1, "killed": 0, "gpus_freed": []}
    assert rank.wait(timeout=5) == -signal.SIGTERM
    assert impostor.poll() is None


def test_a_process_of_the_jobs_user_outside_the_recorded_tree_is_not_proven() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert provenance.proven(child.pid, provenance.own_roots())
        assert not provenance.proven(os.getpid(), [provenance.root_of(child.pid)])
        assert not provenance.proven(child.pid, [provenance.Root(os.getpid(), 1)])  # a reused pid
    finally:
        child.kill()
        child.wait()


def test_a_record_of_roots_another_user_could_write_or_a_link_is_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "n0.roots.json"
    provenance.record(str(path), provenance.own_roots())
    assert provenance.recorded(str(path)) == provenance.own_roots()
    path.chmod(0o622)
    assert provenance.recorded(str(path)) == []
    path.chmod(0o600)
    (tmp_path / "link.json").symlink_to(path)
    assert provenance.recorded(str(tmp_path / "link.json")) == []


class Answering(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(path: Path, body: bytes) -> Answering:
    """An HTTP server on a Unix socket (in this process) that answers every request with `body`."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.rfile.readline()
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for at in range(0, len(body), 1 << 20):
                self.wfile.write(body[at:at + (1 << 20)])

    server = Answering(str(path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fr"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_flight_socket_that_is_a_link_is_never_followed(short_dir: Path) -> None:
    service = serve(short_dir / "service.sock", b'{"root-only": true}')
    try:
        (short_dir / "rank9.sock").symlink_to(short_dir / "service.sock")
        assert fetch(str(short_dir / "service.sock")) == {"flight": {"root-only": True}}
        assert "link" in str(fetch(str(short_dir / "rank9.sock"))["flight_error"])
    finally:
        service.shutdown()


def test_a_flight_answer_from_a_process_that_is_not_the_rank_is_not_believed(short_dir: Path) -> None:
    server = serve(short_dir / "rank0.sock", b'{"entries": []}')
    try:
        got = fetch(str(short_dir / "rank0.sock"), peer=lambda pid: pid == os.getpid() + 10**6)
        assert got == {"flight_error": f"the socket is served by process {os.getpid()}, which is not the job's"}
    finally:
        server.shutdown()


def test_a_flight_answer_of_200_mb_is_cut_off_at_the_cap_within_the_fetch_timeout(short_dir: Path) -> None:
    server = serve(short_dir / "rank0.sock", b"[" + b" " * (200 << 20) + b"]")
    try:
        started = time.monotonic()
        got = fetch(str(short_dir / "rank0.sock"))
        assert got == {"flight_error": "ValueError: the answer is longer than 64 MiB"}
        assert time.monotonic() - started < 5
    finally:
        server.shutdown()


# ---------------------------------------------------------------- checkpoint_dir

CKPT_SCRIPT = "import os\nprint('ckpt at', os.environ['DISTRUN_CHECKPOINT_DIR'])\n"


def ckpt_job(tmp_path: Path, checkpoint_dir: str) -> Path:
    (tmp_path / "ck.py").write_text(CKPT_SCRIPT)
    job = tmp_path / "ck.yaml"
    job.write_text(f"name: ck\nscript: {tmp_path / 'ck.py'}\nnproc_per_node: 1\ncheckpoint_dir: {checkpoint_dir}\n")
    return job


@pytest.mark.parametrize("made_by", ["another user", "root, writable by all"])
def test_a_checkpoint_dir_another_user_owns_or_can_write_is_refused_in_one_line_before_anything_starts(
        tmp_path: Path, made_by: str) -> None:
    theirs = tmp_path / "shared"
    theirs.mkdir()
    theirs.chmod(0o777 if made_by == "root, writable by all" else 0o755)
    if made_by == "another user":
        os.chown(theirs, IMPOSTOR_UID, IMPOSTOR_UID)
    home = tmp_path / "home"
    result = distrun("launch", str(ckpt_job(tmp_path, str(theirs / "ckpt"))), "--backend", "local", "--no-live",
                     home=home)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"distrun: error: localhost: checkpoint_dir {theirs / 'ckpt'}: {theirs} ")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (theirs / "ckpt").exists()
    assert json.loads(distrun("ps", "--json", "--all", home=home).stdout) == []


def test_a_checkpoint_dir_in_home_is_made_0700_and_the_ranks_get_it_with_tilde_expanded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = os.umask(0)
    try:
        result = distrun("launch", str(ckpt_job(tmp_path, "~/ck/pts")), "--backend", "local", "--no-live",
                         home=home, env={"HOME": str(tmp_path)})
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"ckpt at {tmp_path / 'ck' / 'pts'}" in result.stdout
    for made in (tmp_path / "ck", tmp_path / "ck" / "pts"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_the_shipped_supervisors_refusal_of_a_checkpoint_dir_is_its_exit_events_one_line_marked_refused(
        tmp_path: Path) -> None:
    """What the controller turns into a one-line usage error (exit 2) on Slurm, where only the node checks."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone can write here, and it is not sticky
    cfg = config(tmp_path, [sys.executable, "-c", "print('never runs')"], make_dirs=[str(shared / "ck")])
    lines, events = run_shipped(cfg)
    end = events[-1]
    assert (end["ev"], end["refused"], lines) == ("exit", True, [])
    assert end["error"].startswith(f"checkpoint_dir {shared / 'ck'}: {shared} ") and "\n" not in end["error"]
    assert not (shared / "ck").exists()


def test_the_supervisor_refuses_an_unsafe_checkpoint_dir_too_and_accepts_a_sticky_roots_one(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert make_safe_dir("ck", str(sticky)) == str(sticky / "ck")
    os.chown(sticky, IMPOSTOR_UID, IMPOSTOR_UID)  # sticky, but another user's: they can replace what it holds
    with pytest.raises(UnsafeDirError, match=f"checkpoint_dir ck2: {sticky} belongs to uid {IMPOSTOR_UID}"):
        make_safe_dir("ck2", str(sticky))
    assert not (sticky / "ck2").exists()
