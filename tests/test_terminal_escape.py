"""What a host prints never acts on the operator's terminal (issue 14, item 7): `exec` output,
doctor's details and the errors that quote a host show C0 and C1 control characters as text.

The host is this machine (the local transport); what it prints is an OSC title change, a
clear-screen and an 8-bit CSI, as a hostile or broken host would print them.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

from orchestrator.console.terminal import safe_text
from orchestrator.liveness import process_start
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import REPO, distrun, ready_processes, record_this_process_as_the_jobs_root

TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J\x1b[H"
CSI8 = "\u009b31m"
HOSTILE = f"{TITLE}hello{CLEAR}bye{CSI8}"
SHOWN = "\\x1b]0;pwned\\x07hello\\x1b[2J\\x1b[Hbye\\x9b31m"


def controls(text: str) -> set[str]:
    """The control characters in `text` that a terminal would act on (tab and newline aside)."""
    return {c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0}


def local_inventory(tmp_path: Path, python: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"nodes:\n  - {{name: box, host: localhost, transport: local, python: {python}}}\n")
    return path


def hostile_python(tmp_path: Path) -> str:
    """A `python` on the host that prints escape sequences to stderr and fails."""
    said = tmp_path / "hostile.txt"
    said.write_text(HOSTILE + "\n", encoding="utf-8")
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\ncat {said} >&2\nexit 1\n")
    path.chmod(0o755)
    return str(path)


def test_exec_shows_escape_sequences_a_host_printed_as_text(tmp_path: Path) -> None:
    result = distrun("exec", "--", "printf", "%s\\n%s\\n", HOSTILE, "tab\there", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert controls(result.stdout) == set()
    assert f"{SHOWN}\ntab\there\n" in result.stdout


def test_exec_json_keeps_the_output_exact_with_no_raw_control_character(tmp_path: Path) -> None:
    result = distrun("exec", "--json", "--", "printf", "%s", HOSTILE, home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert controls(result.stdout) == set()
    assert json.loads(result.stdout)[0]["stdout"] == HOSTILE


def test_doctor_details_quote_a_failing_host_with_its_escape_sequences_as_text(tmp_path: Path) -> None:
    inventory = local_inventory(tmp_path, hostile_python(tmp_path))
    result = distrun("doctor", "-i", str(inventory), home=tmp_path / "home")
    assert result.returncode != 0
    assert SHOWN in result.stdout, result.stdout
    assert controls(result.stdout + result.stderr) == set()


def test_an_error_that_quotes_a_host_shows_its_escape_sequences_as_text(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    (tmp_path / "train.py").write_text("print('never runs')\n")
    job.write_text(f"name: t\nscript: {tmp_path / 'train.py'}\n")
    inventory = local_inventory(tmp_path, hostile_python(tmp_path))
    result = distrun("launch", str(job), "-i", str(inventory), home=tmp_path / "home")
    assert result.returncode == 3, result.stdout + result.stderr
    assert SHOWN in result.stderr and controls(result.stderr) == set()


RANK_IN_A_HOSTILE_FRAME = """\
import sys, time

def wait():
    print("ready", flush=True)
    time.sleep(120)

wait.__code__ = wait.__code__.replace(co_name="wait" + sys.argv[1], co_qualname="wait" + sys.argv[1])
wait()
"""


def test_stack_shows_a_frame_name_carrying_an_osc_title_as_text(tmp_path: Path, monkeypatch) -> None:
    """A rank whose frame name carries `ESC ] 0; ... BEL` (py-spy reports it as it is): `distrun
    stack` prints it escaped (issue 30, finding 2)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_IN_A_HOSTILE_FRAME)
    home = tmp_path / "home"
    store = Store(home)
    store.save(JobRecord(id="esc-1", name="esc", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                         backend="local", state=JobState.RUNNING, controller_pid=os.getpid(),
                         controller_start=process_start(os.getpid())))  # this test stands for its controller
    record_this_process_as_the_jobs_root(tmp_path, "esc-1", "localhost")
    env = {**os.environ, "DISTRUN_JOB_ID": "esc-1", "DISTRUN_NODE": "localhost", "RANK": "0", "LOCAL_RANK": "0"}
    with ready_processes([([sys.executable, str(script), TITLE], env)]):
        shown = distrun("stack", "esc-1", home=home, env={"HOME": str(tmp_path)})
    assert shown.returncode == 0, shown.stderr
    assert "wait\\x1b]0;pwned\\x07 (rank.py:5)" in shown.stdout
    assert controls(shown.stdout) == set()


def _open_files(tree: ast.AST) -> set[str]:
    """Names bound by `with open(...) as NAME` (files, not terminals)."""
    return {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items
            if isinstance(item.context_expr, ast.Call) and getattr(item.context_expr.func, "id", "") == "open"
            and isinstance(item.optional_vars, ast.Name)}


def _terminal_writes(path: Path) -> list[str]:
    """Calls in `path` that write to a terminal without terminal.show: print, click.echo, and
    `.write` on stdout, stderr or a stream named out, err, terminal or stream."""
    tree = ast.parse(path.read_text())
    files = _open_files(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        target = func.value if isinstance(func, ast.Attribute) else None
        name = getattr(target, "id", getattr(target, "attr", ""))
        if ((isinstance(func, ast.Name) and func.id == "print")
                or (isinstance(func, ast.Attribute) and func.attr in ("echo", "secho") and name == "click")
                or (isinstance(func, ast.Attribute) and func.attr == "write" and name in TERMINAL_NAMES
                    and name not in files)):
            found.append(f"{path}:{node.lineno}")
    return found


TERMINAL_NAMES = {"stdout", "stderr", "out", "err", "terminal", "stream"}


def test_every_terminal_write_goes_through_the_one_writer() -> None:
    """By construction: no module but orchestrator/console/terminal.py writes to a terminal itself. remote/
    runs on the hosts, where its stdout is the channel to the controller, not a terminal; so does
    doctor/allreduce_bench.py, the bandwidth job's rank, whose stdout is its log. rich
    draws `top` and the live view (telemetry/): their lines and the hosts' samples reach it
    through terminal.safe_text (tests/test_telemetry.py)."""
    modules = [p for p in (REPO / "orchestrator").rglob("*.py")
               if p.name not in ("terminal.py", "allreduce_bench.py")
               and "remote" not in p.relative_to(REPO / "orchestrator").parts]
    assert [w for p in modules for w in _terminal_writes(p)] == []


def test_colours_are_kept_and_a_host_control_between_them_is_still_escaped():
    coloured = "\x1b[36m[node1 r0]\x1b[0m step 1\n" * 3
    assert safe_text(coloured) == coloured  # only colours: kept whole
    assert safe_text(coloured + "\x1b[36m[node1 r0]\x1b[0m " + CLEAR + "\n") == (
        coloured + "\x1b[36m[node1 r0]\x1b[0m \\x1b[2J\\x1b[H\n")
