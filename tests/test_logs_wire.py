"""The supervisor's stream (batches framed by rank and stream, events), the line store's layout,
and the tailer of torchrun's per-rank files: fast, in-process."""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.remote import linestore
from orchestrator.remote.linestore import IndexEntry, LineStore, Locator, read_index
from orchestrator.remote.stream import Batch, FrameReader, StreamWriter, encode
from orchestrator.remote.tail import PARTIAL_WAIT, Tailer

# ---------------------------------------------------------------- the stream


def parse(data: bytes, cuts: list[int]) -> list[object]:
    got: list[object] = []
    reader = FrameReader(got.append, lambda e: got.append(("event", e)), lambda ln: got.append(("line", ln)))
    at = 0
    for cut in sorted(set(cuts)):
        reader.feed(data[at:cut])
        at = cut
    reader.feed(data[at:])
    reader.close()
    return got


RECORDS = [Batch(3, "o", 2, b"a\nb\n"), b'\x1e{"ev": "hb"}\n', Batch(None, "e", 1, b"torchrun says\n"),
           Batch(0, "e", 1, b"half\n", partial=True), Batch(12, "o", 1, b"\x1f\x1e not a header\n")]


def stream_of(records: list[object]) -> bytes:
    return b"".join(r if isinstance(r, bytes) else encode(r) for r in records)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_batches_and_events_come_out_whole_however_the_bytes_are_cut(cuts: list[int]) -> None:
    got = parse(stream_of(RECORDS), cuts)

    assert got == [RECORDS[0], ("event", b'{"ev": "hb"}'), *RECORDS[2:]]


def test_a_header_that_cannot_be_read_is_kept_as_a_line_and_the_stream_goes_on() -> None:
    got = parse(b"\x1fgarbage header\nplain line\n" + encode(Batch(1, "o", 1, b"ok\n")), [])

    assert got == [("line", b"\x1fgarbage header"), ("line", b"plain line"), Batch(1, "o", 1, b"ok\n")]


def test_a_batch_cut_off_by_the_end_of_the_stream_keeps_its_lines() -> None:
    data = encode(Batch(1, "o", 3, b"one\ntwo\nthr"))[:-5]

    assert parse(data, []) == [("line", b"one"), ("line", b"tw")]


class Gate(io.RawIOBase):
    """An output whose first write waits until it is opened; records every write."""

    def __init__(self) -> None:
        self.open_ = threading.Event()
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.open_.wait(10)
        self.writes.append(bytes(data))
        return len(data)


def test_events_overtake_batches_queued_while_the_output_was_blocked_and_never_wait() -> None:
    gate = Gate()
    writer = StreamWriter(gate)  # type: ignore[arg-type]
    writer.batch(Batch(0, "o", 1, b"first\n"))  # the writer thread now waits in write()
    time.sleep(0.1)
    for i in range(50):
        writer.batch(Batch(0, "o", 1, b"queued %d\n" % i))
    began = time.monotonic()
    writer.event("tel", {"cpu": 1})
    writer.event("hb")
    writer.event("hb")
    assert time.monotonic() - began < 0.05, "an event never waits on the output"
    gate.open_.set()
    assert writer.end("exit", 5, rc=0)

    assert gate.writes[0].endswith(b"first\n")
    assert gate.writes[1] == b'\x1e{"ev": "tel", "cpu": 1}\n\x1e{"ev": "hb"}\n', "events next, one heartbeat for two"
    rest = b"".join(gate.writes[2:])
    assert rest.index(b"queued 0") < rest.index(b"queued 49") < rest.index(b'"ev": "exit"')


def test_batches_wait_when_the_queue_is_over_its_limit_and_go_on_when_it_drains() -> None:
    gate = Gate()
    writer = StreamWriter(gate, limit=1000)  # type: ignore[arg-type]
    writer.batch(Batch(0, "o", 1, b"x" * 2000 + b"\n"))
    time.sleep(0.1)
    writer.batch(Batch(0, "o", 1, b"y" * 2000 + b"\n"))
    waited = threading.Thread(target=writer.batch, args=(Batch(0, "o", 1, b"z\n"),))
    waited.start()
    waited.join(0.3)
    assert waited.is_alive(), "a producer waits while more than the limit is queued"
    gate.open_.set()
    waited.join(5)
    assert not waited.is_alive() and writer.end("exit", 5)


def test_a_broken_output_is_let_go_and_nothing_waits_on_it() -> None:
    class Broken(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError

    writer = StreamWriter(Broken(), limit=10)  # type: ignore[arg-type]
    for _ in range(100):
        writer.batch(Batch(0, "o", 1, b"line\n"))
    writer.event("hb")
    assert writer.end("exit", 5) is False


# ---------------------------------------------------------------- the layout


def test_the_index_gives_every_batch_its_place_in_its_file(tmp_path: Path) -> None:
    store = LineStore(str(tmp_path))
    batches = [(IndexEntry(1.0, 1, "n0", 0, "o", 2, 4), b"a\nb\n"), (IndexEntry(2.0, 1, "n0", 0, "e", 1, 4), b"err\n"),
               (IndexEntry(3.0, 1, "n0", None, "d", 1, 5), b"note\n"),
               (IndexEntry(4.0, 2, "n0", 0, "o", 1, 2, True), b"c\n")]
    for entry, data in batches:
        store.append(entry, data)
    store.close()

    entries = read_index(str(tmp_path))
    assert entries == [e for e, _ in batches]
    placed = Locator().place_all(entries)
    assert [(tmp_path / p.entry.path).read_bytes()[p.offset:p.offset + p.entry.nbytes] for p in placed] == [
        d for _, d in batches]
    assert {p.entry.path for p in placed} == {"ranks/0.out", "ranks/0.err", "nodes/n0.out"}
    assert oct((tmp_path / "ranks" / "0.out").stat().st_mode & 0o777) == "0o600"


def test_a_buffered_index_is_written_only_on_flush_after_its_data(tmp_path: Path) -> None:
    store = LineStore(str(tmp_path), buffered=True)
    store.append(IndexEntry(1.0, 1, "n0", 1, "o", 1, 3), b"hi\n")
    assert (tmp_path / "ranks" / "1.out").read_bytes() == b"hi\n" and read_index(str(tmp_path)) == []
    store.flush()
    assert len(read_index(str(tmp_path))) == 1
    store.close()


def test_a_write_cut_short_by_a_full_disk_is_taken_back(tmp_path: Path, monkeypatch) -> None:
    store = LineStore(str(tmp_path))
    store.append(IndexEntry(1.0, 1, "n0", 0, "o", 1, 6), b"kept!\n")
    real_write, calls = os.write, []

    def disk_fills(fd: int, data: bytes) -> int:
        calls.append(1)
        if len(calls) == 1:
            return real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(linestore.os, "write", disk_fills)
    try:
        store.append(IndexEntry(2.0, 1, "n0", 0, "o", 1, 9), b"lost one\n")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    monkeypatch.setattr(linestore.os, "write", real_write)
    store.append(IndexEntry(3.0, 1, "n0", 0, "o", 1, 6), b"after\n")
    store.close()

    assert (tmp_path / "ranks" / "0.out").read_bytes() == b"kept!\nafter\n"
    assert [e.time for e in read_index(str(tmp_path))] == [1.0, 3.0]


def test_an_index_line_being_written_is_left_for_later(tmp_path: Path) -> None:
    (tmp_path / "lines.idx").write_text(IndexEntry(1.0, 1, "n0", 0, "o", 1, 2).line() + "2.0\t1\tn0")

    assert len(read_index(str(tmp_path))) == 1


# ---------------------------------------------------------------- the tailer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rank_file(log_dir: Path, local: int, name: str, attempt: int = 0) -> Path:
    folder = log_dir / "run_x" / f"attempt_{attempt}" / str(local)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def tailer(tmp_path: Path) -> tuple[Tailer, list[tuple], Clock]:
    got: list[tuple] = []
    clock = Clock()
    return Tailer(str(tmp_path), lambda *a: got.append(a), clock), got, clock


def test_whole_lines_go_at_once_and_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    tail, got, clock = tailer(tmp_path)
    out = rank_file(tmp_path, 1, "stdout.log")
    out.write_bytes(b"one\ntwo\nthr")
    tail.sweep(rescan=True)
    with open(out, "ab") as fh:
        fh.write(b"ee\n")
    clock.now += 0.1
    tail.sweep()

    assert got == [(0, 1, "o", b"one\ntwo\n", 2, False), (0, 1, "o", b"three\n", 1, False)]


def test_a_partial_line_is_handed_on_marked_after_the_wait_and_at_the_end(tmp_path: Path) -> None:
    tail, got, clock = tailer(tmp_path)
    out = rank_file(tmp_path, 0, "stdout.log")
    out.write_bytes(b"progress ")
    tail.sweep(rescan=True)
    clock.now += PARTIAL_WAIT / 2
    tail.sweep()
    assert got == []
    clock.now += PARTIAL_WAIT
    tail.sweep()
    with open(out, "ab") as fh:
        fh.write(b"done and no newline")
    tail.drain()

    assert got == [(0, 0, "o", b"progress \n", 1, True), (0, 0, "o", b"done and no newline\n", 1, True)]


def test_files_of_a_restart_found_later_are_read_with_their_restart(tmp_path: Path) -> None:
    tail, got, _ = tailer(tmp_path)
    rank_file(tmp_path, 0, "stdout.log").write_bytes(b"first\n")
    tail.sweep(rescan=True)
    rank_file(tmp_path, 0, "stderr.log", attempt=1).write_bytes(b"again\n")
    tail.sweep(rescan=True)

    assert got == [(0, 0, "o", b"first\n", 1, False), (1, 0, "e", b"again\n", 1, False)]


def test_of_a_ranks_two_files_read_at_once_the_one_written_last_goes_last(tmp_path: Path) -> None:
    tail, got, _ = tailer(tmp_path)
    out, err = rank_file(tmp_path, 0, "stdout.log"), rank_file(tmp_path, 0, "stderr.log")
    err.write_bytes(b"Traceback ...\n")
    out.write_bytes(b"last words\n")
    os.utime(err, ns=(2_000_000_000, 2_000_000_000))
    os.utime(out, ns=(1_000_000_000, 1_000_000_000))
    tail.sweep(rescan=True)

    assert [g[3] for g in got] == [b"last words\n", b"Traceback ...\n"]


def test_a_line_longer_than_the_limit_is_handed_on_in_parts(tmp_path: Path, monkeypatch) -> None:
    from orchestrator.remote import tail as tail_module

    monkeypatch.setattr(tail_module, "LINE_MAX", 10)
    tail, got, _ = tailer(tmp_path)
    rank_file(tmp_path, 0, "stdout.log").write_bytes(b"x" * 25)
    tail.sweep(rescan=True)

    assert got == [(0, 0, "o", b"x" * 25 + b"\n", 1, True)]
