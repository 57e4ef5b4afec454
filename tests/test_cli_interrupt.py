"""Ctrl-C at the command line before a job starts: a real SIGINT sent to the real CLI process, by
`python -m orchestrator` and by the console script's own shape, at several delays (while the commands
load, while the hosts are being connected to). One line, exit 130, no traceback, and at once."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.cli.main import INTERRUPTED
from tests.helpers import REPO, wait_for

# What pip writes as the `distrun` console script (the entry point of pyproject.toml).
CONSOLE_SCRIPT = """\
import re
import sys
from orchestrator.cli.main import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""
PROMPT = 5.0  # seconds from the SIGINT to the exit: not the hosts' connect timeout (30 here)


@pytest.fixture
def silent_host(tmp_path: Path) -> Iterator[Path]:
    """An inventory whose one host takes the TCP connection and never says a word of SSH, so that
    the launch waits in its preflight (connecting) for as long as the test needs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(f"defaults: {{user: root, port: {port}, host_key_policy: accept-new}}\n"
                             "nodes:\n  - {name: node0, host: 127.0.0.1}\n")
        yield inventory


def interrupted_after(argv: list[str], delay: float, home: Path) -> tuple[int, str, float]:
    """Start the CLI, SIGINT it after `delay` seconds; its exit code, stderr and seconds to exit."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DISTRUN_HOME": str(home), "DISTRUN_SSH_TIMEOUT": "30",
           "XDG_CONFIG_HOME": str(home / "no-config")}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, time.monotonic() - sent


def read_to_the_end(controller: int, quiet_s: float) -> bytes:
    """What the CLI writes on its pty from now until it closes the terminal or says nothing for `quiet_s`."""
    shown = b""
    while select.select([controller], [], [], quiet_s)[0]:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the CLI closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    return shown


@pytest.mark.parametrize("entry", ["module", "console-script"])
@pytest.mark.parametrize("delay", [0.5, 1.5, 3.0])
def test_ctrl_c_before_the_job_starts_is_one_line_exit_130_at_once(entry: str, delay: float, silent_host: Path,
                                                                     tmp_path: Path) -> None:
    script = tmp_path / "distrun"
    script.write_text(CONSOLE_SCRIPT)
    command = [sys.executable, "-m", "orchestrator"] if entry == "module" else [sys.executable, str(script)]

    code, err, took = interrupted_after([*command, "launch", "jobs/tiny.yaml", "-i", str(silent_host)], delay,
                                        tmp_path / "home")

    assert (code, err.strip()) == (130, INTERRUPTED), err
    assert took < PROMPT, took


def test_ctrl_c_while_the_commands_load_is_the_same_line(tmp_path: Path) -> None:
    """Loading the commands takes seconds on a loaded host (3.7 s at load 22); here one of their
    imports is made that slow: a `click` first on the path that sleeps 3 s as it loads."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "click.py").write_text("import time\ntime.sleep(3)\nraise SystemExit('not reached')\n")
    env = {**os.environ, "PYTHONPATH": f"{slow}:{REPO}", "DISTRUN_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "ps"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)

    assert (proc.returncode, err.strip()) == (130, INTERRUPTED), err


def test_ctrl_c_while_a_detached_launch_waits_says_its_controller_goes_on(silent_host: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DISTRUN_HOME": str(tmp_path / "home"), "DISTRUN_SSH_TIMEOUT": "30",
           "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    argv = [sys.executable, "-m", "orchestrator", "launch", "jobs/tiny.yaml", "-i", str(silent_host), "--detach"]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    launcher = psutil.Process(proc.pid)
    assert wait_for(lambda: any("--detached-child" in c.cmdline() for c in launcher.children()), 60)
    controllers = launcher.children()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)

    said = re.fullmatch(r"distrun: interrupted; job (\S+) goes on in the background \(`distrun stop \1` ends it\)",
                        err.strip())
    assert proc.returncode == 130 and said, err
    assert all(c.is_running() and said[1] in c.cmdline() for c in controllers), "the controller the line speaks of"
    for controller in controllers:
        controller.kill()


def test_ctrl_c_on_a_terminal_erases_the_progress_line_before_saying_so(tmp_path: Path) -> None:
    """`connected 1/2` (one host answered, the other is silent) is erased, not followed by the line."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(f"defaults: {{user: root, port: {listener.getsockname()[1]}}}\nnodes:\n"
                             "  - {name: node0, host: 127.0.0.1}\n"
                             "  - {name: here, host: localhost, transport: local}\n")
        controller, terminal = pty.openpty()
        env = {**os.environ, "PYTHONPATH": str(REPO), "DISTRUN_HOME": str(tmp_path / "home"), "TERM": "xterm",
               "DISTRUN_SSH_TIMEOUT": "30", "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
        argv = [sys.executable, "-m", "orchestrator", "launch", "jobs/tiny.yaml", "-i", str(inventory)]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
        os.close(terminal)
        shown = b""
        try:
            while b"connected 1/2" not in shown and select.select([controller], [], [], 30)[0]:
                shown += os.read(controller, 65536)
            proc.send_signal(signal.SIGINT)
            shown += read_to_the_end(controller, 10)
        finally:
            os.close(controller)
            proc.kill()

    assert proc.wait(10) == 130
    assert shown.endswith(b"connected 1/2\r\x1b[2K" + INTERRUPTED.encode() + b"\r\n"), shown


def test_ctrl_c_typed_into_the_live_view_is_not_echoed_and_leaves_nothing_of_it(tmp_path: Path) -> None:
    """Ctrl-C typed on the launch's own terminal (its controlling tty, as a person's): the tty does
    not echo `^C` into the live view (at its right edge it wrapped the cursor, and the view's title
    stayed on screen), the view is cleared before the last line, and the tty's setting comes back."""
    script = tmp_path / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(300)\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: sleepy\nscript: {script}\nnproc_per_node: 1\nbackend: local\n")
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "DISTRUN_HOME": str(tmp_path / "home"), "TERM": "xterm-256color",
           "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job)], cwd=REPO, env=env,
                            stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(terminal)
    shown = b""
    try:
        while b"training" not in shown and select.select([controller], [], [], 60)[0]:
            shown += os.read(controller, 65536)
        time.sleep(2)  # the live view redraws a few times
        os.write(controller, b"\x03")
        shown += read_to_the_end(controller, 30)
        echoes_control = bool(termios.tcgetattr(controller)[3] & termios.ECHOCTL)
    finally:
        os.close(controller)
        proc.kill()

    assert proc.wait(10) == 130
    assert b"^C" not in shown
    assert re.search(rb"(\x1b\[1A\x1b\[2K){7}job sleepy-\S+ stopped \(SIGINT\)[^\n]*\r\n$", shown), shown[-400:]
    assert echoes_control, "the terminal's ECHOCTL is back"
