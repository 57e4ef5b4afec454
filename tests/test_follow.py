"""The one follower of a growing file (orchestrator/remote/follow.py), on real files."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.remote.follow import Follower, appended


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_a_partial_last_line_is_held_back_until_its_newline_comes(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"one\ntw")
    with Follower(path) as follower:
        assert (follower.lines(), follower.pending) == (b"one\n", b"tw")
        assert follower.lines() == b""
        append(path, b"o\nthree")
        assert follower.lines() == b"two\n"
        assert follower.take_pending() == b"three"
        assert (follower.pending, follower.lines()) == (b"", b"")


def test_a_file_that_appears_late_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "late.log"
    with Follower(path, last=4) as follower:
        assert follower.read() == b""
        path.write_bytes(b"first line\nsecond\n")
        assert follower.lines() == b"first line\nsecond\n"


def test_a_truncated_file_is_read_again_from_its_start_and_its_held_line_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    path.write_bytes(b"old line\nold partial")
    with Follower(path) as follower:
        assert follower.lines() == b"old line\n"
        path.write_bytes(b"new\n")
        assert follower.lines() == b"new\n"
        assert follower.pending == b""


def test_a_replaced_file_is_read_to_its_end_then_the_new_one_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"a\n")
    with Follower(path) as follower:
        assert follower.read() == b"a\n"
        append(path, b"b\n")
        (tmp_path / "next.log").write_bytes(b"c but longer than before\n")
        os.replace(tmp_path / "next.log", path)
        assert follower.read() == b"b\n"
        assert follower.read() == b"c but longer than before\n"


def test_started_near_the_end_it_begins_at_the_first_whole_line_there(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_bytes(b"0123456789\nabc\ndef\n")
    assert Follower(path, last=9).lines() == b"abc\ndef\n"
    assert Follower(path, last=8).lines() == b"abc\ndef\n"
    assert Follower(path, last=7).lines() == b"def\n"
    assert Follower(path, last=100).lines() == b"0123456789\nabc\ndef\n"


def test_a_read_takes_at_most_its_limit_and_the_rest_next_time(tmp_path: Path) -> None:
    path = tmp_path / "l.log"
    path.write_bytes(b"abcdef")
    with Follower(path) as follower:
        assert (follower.read(4), follower.read(4), follower.read(4)) == (b"abcd", b"ef", b"")


def test_appended_waits_for_the_file_and_drains_it_once_finished(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    looks = []

    def finished() -> bool:
        looks.append(1)
        if len(looks) == 2:
            path.write_bytes(b"late\n")
        if len(looks) == 4:
            append(path, b"last")
        return len(looks) >= 4

    with Follower(path) as follower:
        assert b"".join(appended(follower, finished, 0.0)) == b"late\nlast"
