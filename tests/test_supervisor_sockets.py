"""The ranks' socket directory leaves nothing behind (issue 46.9): the short one under the temporary
directory, made when ~/.distrun/jobs/<id>/sock is too long for a socket, is removed by the `distrun
stop` cleanup or `distrun prune` that follows a SIGKILLed supervisor (the supervisor records it in
the job's directory); and a rank's socket that the rank did not remove (killed) is removed when
the job ends."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.remote import cleanup, prune
from tests.test_supervisor_lifecycle import config, run_shipped

LONG = "~/" + "d" * 80 + "/sock"  # too long for rank99999.sock: the fallback under the temporary directory


def fallbacks(job_id: str) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"distrun-{job_id[:8]}-*"))


def killed_supervisor(tmp_path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A job (one `sleep`) whose supervisor made the fallback socket directory and was then
    SIGKILLed; its job id and the sleep's supervisor process (reaped)."""
    job_id = f"k{time.monotonic_ns() % 10**7:07d}-sockets"
    cfg = config(tmp_path, ["sleep", "120"], job_id=job_id, host_dir="~/.distrun",
                 env={"DISTRUN_WORKER_SOCKETS": LONG})
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", job_id, "n0")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n")
    proc.stdin.flush()
    out = b""
    while b'"started"' not in out:
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, out[-2000:]
        out += chunk
    assert len(fallbacks(job_id)) == 1
    proc.kill()
    proc.wait()
    return job_id, proc


@pytest.mark.parametrize("after", ["stop", "prune"])
def test_the_fallback_socket_directory_of_a_sigkilled_supervisor_goes_with_the_next_stop_or_prune(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], after: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    job_id, _ = killed_supervisor(tmp_path)
    left = fallbacks(job_id)
    try:
        assert len(left) == 1  # the supervisor died before its own cleanup
        if after == "stop":
            cleanup.main([job_id, "n0", "1"])
            assert json.loads(capsys.readouterr().out)["found"] == 1  # the sleep, ended with it
        else:
            prune.main([job_id])
            assert json.loads(capsys.readouterr().out) == {"removed": [job_id]}
        assert fallbacks(job_id) == []
    finally:
        cleanup.main([job_id, "n0", "0"])  # the sleep, whatever happened
        for path in left:
            subprocess.run(["rm", "-rf", path], check=False)


def test_a_record_that_names_a_directory_not_the_jobs_fallback_removes_nothing(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    job_dir = tmp_path / ".distrun" / "jobs" / "j-rec"
    job_dir.mkdir(parents=True, mode=0o700)
    keep = tmp_path / "keep"
    keep.mkdir()
    (job_dir / "n0.sockdir").write_text(f"{keep}\n")
    (job_dir / "n0.sockdir").chmod(0o600)
    cleanup.main(["j-rec", "n0", "0"])
    assert keep.is_dir() and not (job_dir / "n0.sockdir").exists()


def test_a_ranks_socket_left_in_sock_is_removed_when_the_job_ends(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank killed before it could remove its own socket (here: one that exits without)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    binds = ("import os, socket\ns = socket.socket(socket.AF_UNIX)\n"
             "s.bind(os.path.join(os.environ['DISTRUN_WORKER_SOCKETS'], 'rank0.sock'))\n"
             "print('bound', flush=True)\nos.kill(os.getpid(), 9)\n")
    cfg = config(tmp_path, [sys.executable, "-c", binds], host_dir="~/.distrun",
                 env={"DISTRUN_WORKER_SOCKETS": "~/.distrun/jobs/j-sock/sock"}, job_id="j-sock")
    lines, events = run_shipped(cfg)
    sock = tmp_path / ".distrun" / "jobs" / "j-sock" / "sock"
    assert lines == ["bound"] and events[-1]["rc"] == -signal.SIGKILL
    assert sock.is_dir() and list(sock.iterdir()) == []
