"""Shared test helpers: run the real `distrun` command in a subprocess."""

from __future__ import annotations

import fcntl
import os
import pty
import secrets
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from orchestrator.remote.private import make_private_dirs
from orchestrator.remote.provenance import own_roots, record, record_path

REPO = Path(__file__).resolve().parent.parent

# The test hosts share this machine's home, so their host-side job copies (~/.distrun/jobs/<id>)
# outlive a run: a fixed job id would add to an earlier run's copy.
RUN_TAG = secrets.token_hex(3)


def unique_job_id(name: str) -> str:
    """`name` made unique to this test run (the same within the run)."""
    return f"{name}-{RUN_TAG}"


def wait_for(predicate: Callable[[], bool], timeout: float, every: float = 0.2) -> bool:
    """Whether `predicate` came true within `timeout` seconds, asked every `every` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def distrun(*args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 300,
            cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run `python -m orchestrator ARGS` with DISTRUN_HOME=home; stdout/stderr captured."""
    # No user config file either (a test that wants one sets XDG_CONFIG_HOME).
    full_env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1",
                "XDG_CONFIG_HOME": str(home / "no-config"), **(env or {})}
    full_env.pop("DISTRUN_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=full_env, capture_output=True,
        text=True, timeout=timeout, check=False,
    )


def plant_module(directory: Path, name: str, marker: Path) -> Path:
    """Plant a module `name` in `directory` as a hostile local user would: importing it appends
    the importer's pid and argv to `marker`, then hands over the real module, so that whatever
    imports it by mistake keeps working (and the test sees who did).

    Returns:
        The planted file (`directory/name/__init__.py` for a package name such as torch).
    """
    here = str(directory.resolve())
    path = directory / name / "__init__.py" if name == "torch" else directory / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "import importlib, os, sys\n"
        f"with open({str(marker)!r}, 'a') as _fh:\n"
        "    _fh.write(f'{os.getpid()} {sys.argv!r}\\n')\n"
        f"sys.path[:] = [p for p in sys.path if os.path.realpath(p or '.') != {here!r}]\n"
        f"del sys.modules[{name!r}]\n"
        f"sys.modules[{name!r}] = importlib.import_module({name!r})\n"
    )
    return path
def job_lines(job_dir: Path, bare: bool = False, **query: object) -> str:
    """A job directory's lines as `distrun logs` shows them (`[node1 r3] text`, arrival order).

    Args:
        job_dir: The job's directory (`$DISTRUN_HOME/jobs/<id>`).
        bare: The text of each line only.
        query: Filters, as orchestrator.logs.query.Query takes them (ranks=frozenset({3}), ...).
    """
    from orchestrator.logs.query import Query, Style, read_lines

    return "".join(read_lines(job_dir, Query(**query), Style(bare=bare)))  # type: ignore[arg-type]


def record_this_process_as_the_jobs_root(home: Path, job_id: str, node: str) -> None:
    """Record this test process as the root of a job's processes on `node`, where the supervisor
    would (its children, started as the job's ranks, are then provably the job's)."""
    job_dir = home / ".distrun" / "jobs" / job_id
    make_private_dirs(job_dir)
    record(record_path(str(job_dir), node), own_roots())


@contextmanager
def ready_processes(commands: Sequence[tuple[list[str], dict[str, str]]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start each (argv, env), wait until each has printed `ready`, and kill them all on leaving."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for argv, env in commands:
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def on_terminal(args: Sequence[str], home: Path, env: dict[str, str], size: tuple[int, int] = (40, 140),
                timeout: float = 240) -> str:
    """Run distrun with its stdout and stderr on a pseudo-terminal of `size` (rows, columns) until it
    exits 0 (asserted); what it wrote, read until its last writer closed the terminal."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    full_env = {**os.environ, "DISTRUN_HOME": str(home), "TERM": "xterm-256color", **env}
    full_env.pop("DISTRUN_INVENTORY", None)
    full_env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=REPO, env=full_env,
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([controller], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            out += chunk
        text = out.decode(errors="replace")
        assert proc.wait(10) == 0, text[-4000:]
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
    return text
