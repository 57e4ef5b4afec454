"""What a host prints never acts on the operator's terminal (issue 14, item 7): `exec` output,
doctor's details and the errors that quote a host show C0 and C1 control characters as text.

The host is this machine (the local transport); what it prints is an OSC title change, a
clear-screen and an 8-bit CSI, as a hostile or broken host would print them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import distrun

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
