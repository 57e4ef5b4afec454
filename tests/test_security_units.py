"""Issue 14's building blocks, each on its own: safe paths for every Python distrun starts,
private files whatever the umask, secrets masked, control characters escaped."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.remote.private import make_private_dirs, open_private, write_private
from orchestrator.remote.redact import Masker, escape_controls, escape_json, mask

PLANTED = "import sys\nsys.stdout.write('PLANTED\\n')\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- safe paths


def test_the_bootstrap_of_shipped_programs_imports_nothing_from_its_working_directory(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text(PLANTED)
    (tmp_path / "types.py").write_text(PLANTED)
    payload = remote.bundle("output", ["output"])
    argv = remote.bootstrap_argv(sys.executable, payload)
    # output.main does not exist: the bootstrap reads and installs the bundle, then fails on the call.
    result = subprocess.run(argv, input=payload, cwd=tmp_path, capture_output=True, text=False, check=False)
    assert b"PLANTED" not in result.stdout
    assert b"has no attribute 'main'" in result.stderr


@pytest.mark.parametrize("dash_p", [True, False])
def test_module_argv_runs_the_module_as_dash_m_does_without_the_working_directory(tmp_path: Path,
                                                                                   dash_p: bool) -> None:
    (tmp_path / "platform.py").write_text(PLANTED)
    argv = [*remote.module_argv(sys.executable, "json.tool", dash_p), "--sort-keys"]
    (tmp_path / "json.py").write_text(PLANTED)
    result = subprocess.run(argv, input='{"b": 1, "a": [2]}', cwd=tmp_path, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "PLANTED" not in result.stdout and json.loads(result.stdout) == {"a": [2], "b": 1}
    shown = subprocess.run([*remote.module_argv(sys.executable, "platform", dash_p)], cwd=tmp_path,
                           capture_output=True, text=True, check=False)
    assert shown.returncode == 0 and shown.stdout.startswith("Linux-"), shown.stdout + shown.stderr


def test_the_torchrun_program_imports_nothing_from_its_own_directory_without_dash_p(tmp_path: Path) -> None:
    """Where the host's python may lack -P, the plan runs `python distrun_torchrun.py ...`: the
    program drops its own directory from sys.path before it imports anything."""
    program = tmp_path / remote.TORCHRUN_PROGRAM
    program.write_text(remote.program_sources()[remote.TORCHRUN_PROGRAM])
    for name in ("json.py", "runpy.py", "contextlib.py", "argparse.py"):
        (tmp_path / name).write_text(PLANTED)
    result = subprocess.run([sys.executable, str(program), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "PLANTED" not in result.stdout + result.stderr and "--nproc-per-node" in result.stdout


# ---------------------------------------------------------------- private files


def test_private_dirs_and_files_are_0700_and_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        make_private_dirs(tmp_path / "home" / "jobs" / "j1")
        with open_private(tmp_path / "home" / "jobs" / "j1" / "combined.log", "a", encoding="utf-8") as fh:
            fh.write("line\n")
        os.umask(0o777)  # nothing at all allowed: the modes are still exact
        write_private(tmp_path / "home" / "distrun.db", b"")
        make_private_dirs(tmp_path / "home" / "jobs" / "j2" / "nodes")
    finally:
        os.umask(old)
    for directory in ("home", "home/jobs", "home/jobs/j1", "home/jobs/j2", "home/jobs/j2/nodes"):
        assert mode(tmp_path / directory) == 0o700, directory
    assert mode(tmp_path / "home" / "jobs" / "j1" / "combined.log") == 0o600
    assert mode(tmp_path / "home" / "distrun.db") == 0o600


def test_an_existing_directory_keeps_its_mode_and_an_existing_file_is_appended_and_made_0600(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o1777)
    make_private_dirs(shared / "mine")
    log = shared / "mine" / "a.log"
    log.write_text("first\n")
    log.chmod(0o644)
    with open_private(log, "a", encoding="utf-8") as fh:
        fh.write("second\n")
    assert mode(shared) == 0o1777 and mode(shared / "mine") == 0o700
    assert log.read_text() == "first\nsecond\n" and mode(log) == 0o600


def test_a_database_left_readable_by_an_older_distrun_is_made_0600(tmp_path: Path) -> None:
    from orchestrator.store import Store

    (tmp_path / "home").mkdir()
    Store(tmp_path / "home")
    db = tmp_path / "home" / "distrun.db"
    db.chmod(0o644)
    Store(tmp_path / "home")
    assert mode(db) == 0o600


# ---------------------------------------------------------------- masking


def test_masker_replaces_every_secret_value_longest_first_in_text_and_bytes() -> None:
    masker = Masker(["tok-123", "tok-123-long", ""])
    assert masker.text("a tok-123-long b tok-123 c") == "a *** b *** c"
    assert masker.bytes(b"a tok-123-long b tok-123 c") == b"a *** b *** c"
    assert masker.text("nothing to hide") == "nothing to hide"
    assert not Masker([""]) and Masker(["x1"])
    assert mask("pem: -----A\nBB-----", ["-----A\nBB-----"]) == "pem: ***"


def test_masker_takes_secrets_with_regex_characters_literally() -> None:
    masker = Masker(["a.b*c(d)", "p@ss|w0rd"])
    assert masker.text("a.b*c(d) axbbbc(d) p@ss|w0rd p@ss") == "*** axbbbc(d) *** p@ss"


# ---------------------------------------------------------------- escaping


def test_escape_shows_c0_c1_and_del_as_text_and_keeps_tab_and_printable_unicode() -> None:
    title = "\x1b]0;pwned\x07"
    clear = "\x1b[2J\x1b[H"
    assert escape_controls(f"{title}ok{clear}") == "\\x1b]0;pwned\\x07ok\\x1b[2J\\x1b[H"
    assert escape_controls("a\tb\rc\x00d\x7fe\x9bf\x85g") == "a\tb\\x0dc\\x00d\\x7fe\\x9bf\\x85g"
    assert escape_controls("naïve — 日本 ✓") == "naïve — 日本 ✓"
    assert escape_controls("one\x1b[31m\ntwo\n") == "one\\x1b[31m\ntwo\n"


def test_escape_json_keeps_the_data_and_leaves_no_c1_character() -> None:
    data = {"stdout": "csi \x9b2J and \x1b[2J, del \x7f, é", "n": [1, 2]}
    text = escape_json(json.dumps(data, indent=2, ensure_ascii=False))
    assert json.loads(text) == data
    assert not any(0x7F <= ord(c) < 0xA0 or (ord(c) < 0x20 and c != "\n") for c in text)
    assert "é" in text
