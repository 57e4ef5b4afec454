"""The controller's side of a host's output: the reader never waits on the terminal, survives what
goes wrong while handling a line, masks secrets, and folds noise on screen (files keep all)."""

from __future__ import annotations

import errno
import io
import threading
import time
from pathlib import Path

from orchestrator.logs import LogSink
from orchestrator.logs.query import Query, Style, read_lines
from orchestrator.logs.screen import Screen
from orchestrator.plan import HostPlan
from orchestrator.remote.linestore import LineStore
from orchestrator.remote.stream import Batch, encode
from orchestrator.run.hostrun import HostRun
from orchestrator.store import JobDir
from tests.helpers import job_lines

SECRET = "hunter2-secret"


class StalledTerminal(io.StringIO):
    """A terminal nobody reads (a paused pager): every write waits until `resume`."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed = threading.Event()

    def write(self, text: str) -> int:
        self.resumed.wait()
        return super().write(text)

    def isatty(self) -> bool:
        return False


def host(sink: LogSink, node: str = "node0") -> HostRun:
    return HostRun(HostPlan(node, "10.0.0.1", 0, 2, "python3", "/w", [], {}, [], None), sink)


def lines(count: int, rank: int = 0, start: int = 0) -> bytes:
    return encode(Batch(rank, "o", count, b"".join(b"line %d %d\n" % (rank, i) for i in range(start, start + count))))


def stored(job_dir: JobDir, **query: object) -> list[str]:
    return "".join(read_lines(job_dir.root, Query(**query), Style(bare=True))).splitlines()  # type: ignore[arg-type]


def test_a_stalled_terminal_never_holds_up_the_reader_and_the_summary_counts_what_it_missed(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "j-1")
    terminal = StalledTerminal()
    sink = LogSink(job_dir, Screen(terminal, limit=50_000, job_id="j-1"))
    run = host(sink)
    began = time.monotonic()
    for start in range(0, 20_000, 1000):
        run.on_data(lines(1000, start=start))
    assert time.monotonic() - began < 5, "the reader must not wait for the terminal"
    assert time.monotonic() - run.last_seen < 5, "hearing the host keeps it alive whatever the terminal does"
    sink.flush()
    assert len(stored(job_dir)) == 20_000, "the files get every line while the terminal is stalled"
    sink.close_screen(0.2)
    terminal.resumed.set()
    (shortfall,) = sink.shortfalls()
    assert "were not shown on the terminal" in shortfall and "distrun logs j-1" in shortfall
    assert int(shortfall.split()[0]) >= 20_000 - 50_000 // 10
    sink.close()


def test_a_stalled_pipe_gets_every_line_in_order_in_the_end_and_never_holds_up_the_reader(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "j-1")
    job_dir.create()
    pipe = StalledTerminal()
    sink = LogSink(job_dir, Screen(pipe, limit=50_000, job_id="j-1", job_dir=job_dir.root))
    run = host(sink)
    began = time.monotonic()
    for start in range(0, 60_000, 1000):
        run.on_data(lines(1000, start=start))
    assert time.monotonic() - began < 5, "the reader must not wait for the pipe"
    assert (job_dir.root / "screen.spill").stat().st_size > 50_000, "what does not fit in memory waits on disk"
    pipe.resumed.set()
    sink.close_screen(0.2)

    assert pipe.getvalue().splitlines() == [f"[node0 r0] line 0 {i}" for i in range(60_000)]
    assert sink.shortfalls() == [] and not (job_dir.root / "screen.spill").exists()
    sink.close()


class StalledTty(StalledTerminal):
    def isatty(self) -> bool:
        return True


def test_an_interactive_terminal_that_fell_behind_skips_ahead_and_says_where(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "j-1")
    job_dir.create()
    tty = StalledTty()
    sink = LogSink(job_dir, Screen(tty, limit=50_000, job_id="j-1", job_dir=job_dir.root))
    run = host(sink)
    for start in range(0, 20_000, 1000):
        run.on_data(lines(1000, start=start))
    tty.resumed.set()
    time.sleep(0.5)  # the writer empties its queue
    run.on_data(lines(1, start=20_000))
    sink.close_screen(5)

    shown = tty.getvalue().splitlines()
    markers = [line for line in shown if "skipped here" in line]
    skipped = sum(int(line.split()[1]) for line in markers)
    assert markers and all(line == f"[distrun] {line.split()[1]} lines skipped here: the terminal fell behind "
                           "(distrun logs j-1 has every line)" for line in markers)
    assert shown[-1] == "[node0 r0] line 0 20000" and len(shown) - len(markers) + skipped == 20_001
    (shortfall,) = sink.shortfalls()
    assert shortfall.split()[0] == str(skipped) and "distrun logs j-1" in shortfall
    sink.close()


class IndexCheckingTerminal(io.StringIO):
    """A terminal that, for every rank line it is given, asks `distrun logs` whether it has it yet."""

    def __init__(self, job_dir: JobDir) -> None:
        super().__init__()
        self.job_dir = job_dir
        self.unstored: list[str] = []

    def write(self, text: str) -> int:
        kept = set(stored(self.job_dir))
        self.unstored += [ln for ln in text.splitlines() if ln.startswith("[node0 r0] ")
                          and ln.removeprefix("[node0 r0] ") not in kept]
        return super().write(text)

    def isatty(self) -> bool:
        return False


def test_every_line_the_terminal_shows_is_already_in_distrun_logs(tmp_path: Path) -> None:
    """A controller SIGKILLed right after a line reached the screen must not lose it from the job's files."""
    job_dir = JobDir(tmp_path / "j-1")
    terminal = IndexCheckingTerminal(job_dir)
    sink = LogSink(job_dir, Screen(terminal, job_id="j-1"))
    run = host(sink)
    for start in range(0, 50, 10):
        run.on_data(lines(10, start=start))
        time.sleep(0.02)
    sink.close_screen()
    assert "[node0 r0] line 0 49" in terminal.getvalue()
    assert terminal.unstored == []
    sink.close()


def test_an_error_while_handling_output_is_said_once_and_the_next_lines_are_still_handled(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path)
    terminal = io.StringIO()
    sink = LogSink(job_dir, Screen(terminal))
    run = host(sink)
    real, calls = LogSink.batch, []

    def fails_twice(self: LogSink, node: str, batch: Batch) -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("database is locked")
        real(self, node, batch)

    sink.batch = fails_twice.__get__(sink)  # type: ignore[method-assign]
    run.on_data(lines(1) + lines(1, start=1) + b'\x1e{"ev": "tel", bad json\n' + lines(1, start=2))
    run.on_data(b'\x1e{"ev": "exit", "rc": 0}\n')
    sink.close()

    assert run.exited.is_set() and run.exit_rc == 0, "the reader lived on to see the exit"
    assert run.handling_errors == 3
    shown = terminal.getvalue()
    assert shown.count("RuntimeError: database is locked") == 1 and "JSONDecodeError" in shown
    assert "[node0 r0] line 0 2" in shown


def test_a_full_disk_on_the_controller_is_said_once_counted_and_the_screen_still_shows_lines(
        tmp_path: Path, monkeypatch) -> None:
    job_dir = JobDir(tmp_path)
    terminal = io.StringIO()
    sink = LogSink(job_dir, Screen(terminal))

    def no_space(self: LineStore, entry: object, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LineStore, "append", no_space)
    run = host(sink)
    run.on_data(lines(5) + lines(5, start=5))
    sink.close()

    assert terminal.getvalue().count("No space left on device") == 1
    assert terminal.getvalue().count("[node0 r0] line 0") == 10
    assert sink.unstored == 10 and "10 line(s) could not be written" in sink.shortfalls()[0]


def test_secret_values_are_masked_in_the_files_on_screen_and_in_the_summarys_lines(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path)
    terminal = io.StringIO()
    sink = LogSink(job_dir, Screen(terminal), secrets=[SECRET])
    run = host(sink)
    run.on_data(encode(Batch(1, "e", 1, f"token={SECRET}!\n".encode())))
    sink.note("node0", f"reason mentions {SECRET}")
    sink.close()

    everything = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in everything and SECRET not in terminal.getvalue()
    assert "[node0 r1 err] token=***!" in terminal.getvalue()
    assert sink.last_lines("node0", 1, 5) == ("token=***!",)


def test_a_ranks_last_lines_keep_stdout_and_stderr_in_the_order_they_came(tmp_path: Path) -> None:
    sink = LogSink(JobDir(tmp_path))
    run = host(sink)
    run.on_data(encode(Batch(3, "o", 2, b"step 9\nlast words\n")) + encode(Batch(3, "e", 2, b"Traceback\nError\n")))
    sink.close()

    assert run.last_lines(3) == ("step 9", "last words", "Traceback", "Error")
    assert run.last_lines(None) == ("step 9", "last words", "Traceback", "Error")


def test_what_a_stop_makes_a_host_print_on_stderr_is_folded_into_one_line_on_screen(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path)
    terminal = io.StringIO()
    sink = LogSink(job_dir, Screen(terminal, job_id="j-2"))
    run = host(sink, "node2")
    run.on_data(encode(Batch(4, "o", 1, b"step 5\n")))
    sink.stopping("node2")
    noise = b"".join(b"  File \"run.py\", line %d\n" % i for i in range(40)) + b"SignalException: got signal 15\n"
    run.on_data(encode(Batch(None, "e", 41, noise)) + encode(Batch(4, "o", 1, b"saved checkpoint\n")))
    run.on_data(b'\x1e{"ev": "exit", "rc": -15}\n')
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert "SignalException: got signal 15" not in terminal.getvalue()
    assert "[node2 r4] saved checkpoint" in shown, "a rank's own stdout still shows"
    folded = [line for line in shown if "shutdown output" in line]
    assert folded == ["[node2] 41 lines of shutdown output (distrun logs j-2 --node node2)"]
    assert len(stored(job_dir, stderr=True)) == 41, "the files keep everything"


def traceback(rank: int, error: str, frames: int = 6) -> bytes:
    lines = [f"[rank{rank}]: Traceback (most recent call last):"]
    lines += [f'[rank{rank}]:   File "train.py", line {i}, in step' for i in range(frames)]
    return ("\n".join([*lines, f"[rank{rank}]: {error}"]) + "\n").encode()


CHILD_FAILED = b"""Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4242)
============================================================
"""


def test_a_failures_aftermath_folds_to_one_counted_line_per_host_and_the_failed_ranks_traceback_stays_whole(
        tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path)
    terminal = io.StringIO()
    sink = LogSink(job_dir, Screen(terminal, job_id="j-3"))
    runs = {node: host(sink, node) for node in ("node0", "node1", "node2")}
    runs["node0"].on_data(encode(Batch(0, "o", 1, b"step 6 loss 1.2\n")))
    runs["node1"].on_data(encode(Batch(3, "e", 8, traceback(3, "RuntimeError: injected failure on rank 3"))))
    for node, rank in (("node0", 0), ("node0", 1), ("node2", 4), ("node1", 2)):
        runs[node].on_data(encode(Batch(rank, "e", 8, traceback(rank, "RuntimeError: [gloo] Connection reset"))))
    runs["node1"].on_data(encode(Batch(None, "e", 9, CHILD_FAILED)))
    sink.failed_rank("node1", 3)
    for node in ("node0", "node2"):
        sink.stopping(node)
        runs[node].on_data(encode(Batch(None, "e", 2, b"Sending process 7 closing signal SIGTERM\nSignalException\n")))
        runs[node].on_data(b'\x1e{"ev": "exit", "rc": -15}\n')
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert shown[0] == "[node0 r0] step 6 loss 1.2"
    assert shown[1:9] == [f"[node1 r3 err] {line}" for line in traceback(3, "RuntimeError: injected failure on rank 3")
                          .decode().splitlines()]
    assert sorted(shown[9:]) == ["[node0] 18 lines of shutdown output (distrun logs j-3 --node node0)",
                                 "[node1] 17 lines of shutdown output (distrun logs j-3 --node node1)",
                                 "[node2] 10 lines of shutdown output (distrun logs j-3 --node node2)"]
    assert "Root Cause" not in terminal.getvalue() and "Connection reset" not in terminal.getvalue()
    assert len(stored(job_dir, stderr=True)) == 8 * 5 + 9 + 2 * 2, "the files keep everything"


def test_distruns_notes_about_a_host_it_is_stopping_fold_into_that_hosts_counted_line(tmp_path: Path) -> None:
    # One rank's failure on 3 hosts showed 44 lines against the issue's 40: the stopped hosts'
    # "stopping" and "job processes ended" notes were 4 of them.
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal, job_id="j-5"))
    run = host(sink, "node0")
    run.on_data(b'\x1e{"ev": "note", "msg": "started"}\n')
    sink.stopping("node0")
    run.on_data(b'\x1e{"ev": "note", "msg": "stopping (node1 failed)"}\n')
    run.on_data(b'\x1e{"ev": "note", "msg": "job processes ended (stopped by the controller); 0 needed SIGKILL"}\n')
    run.on_data(b'\x1e{"ev": "exit", "rc": -15}\n')
    sink.close()

    assert terminal.getvalue().splitlines() == [
        "[node0] distrun: started", "[node0] 2 lines of shutdown output (distrun logs j-5 --node node0)"]
    assert "distrun: stopping (node1 failed)" in sink.last_lines("node0", None, 5), "the files keep them"


def test_the_root_causes_traceback_shows_once_known_when_another_ranks_came_first(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal, job_id="j-4"))
    run = host(sink, "node1")
    run.on_data(encode(Batch(2, "e", 8, traceback(2, "RuntimeError: [gloo] Connection reset"))))
    run.on_data(encode(Batch(3, "e", 8, traceback(3, "ValueError: the real cause"))))
    sink.failed_rank("node1", 3)
    sink.close()

    shown = terminal.getvalue()
    assert shown.count("ValueError: the real cause") == 1 and shown.count("Traceback") == 2
    assert "[node1 r3 err] [rank3]: Traceback (most recent call last):" in shown
    assert shown.splitlines()[-1] == "[node1 r3 err] [rank3]: ValueError: the real cause"
    assert "shutdown output" not in shown, "nothing of it is left folded"


def test_only_another_ranks_traceback_is_folded_its_lines_after_it_still_show(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal, job_id="j-6"))
    run = host(sink, "node0")
    run.on_data(encode(Batch(0, "e", 8, traceback(0, "KeyError: 'caught and logged'"))))
    chained = traceback(1, "OSError: cache miss", 2) + b"[rank1]: \n[rank1]: During handling of the above exception, " \
        b"another exception occurred:\n[rank1]: \n" + traceback(1, "KeyError: 'caught and logged'", 2)
    run.on_data(encode(Batch(1, "e", 12, chained + b"[rank1]: warning: retrying without the cache\n")))
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert shown[-2:] == ["[node0 r1 err] [rank1]: warning: retrying without the cache",
                          "[node0] 11 lines of shutdown output (distrun logs j-6 --node node0)"]
    assert sum("Traceback" in line for line in shown) == 1


def test_torchruns_exit_barrier_traceback_on_a_successful_job_folds_the_same_way(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal, job_id="j-5"))
    run = host(sink, "node2")
    run.on_data(encode(Batch(4, "o", 1, b"done\n")))
    barrier = b"Error waiting on exit barrier. Elapsed: 300 seconds\n" + CHILD_FAILED.replace(b"ChildFailedError",
                                                                                             b"DistStoreError")
    run.on_data(encode(Batch(None, "e", barrier.count(b"\n"), barrier)))
    run.on_data(encode(Batch(None, "e", 1, b"more of it\n")))
    run.on_data(b'\x1e{"ev": "exit", "rc": 0}\n')
    sink.close()

    assert terminal.getvalue().splitlines() == [
        "[node2 r4] done", "[node2] 11 lines of shutdown output (distrun logs j-5 --node node2)"]


def test_c10ds_hostname_warning_that_every_launch_prints_stays_off_the_screen_and_in_the_files(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal))
    warning = b"[W socket.cpp:767] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
    for node in ("node0", "node1", "node2"):
        host(sink, node).on_data(encode(Batch(0, "e", 3, warning * 2 + b"real error\n")))
    sink.close()

    shown = terminal.getvalue()
    assert "cannot be retrieved" not in shown and shown.count("real error") == 3
    assert job_lines(tmp_path).count("cannot be retrieved. err=-3") == 6


def test_metrics_and_checksum_lines_stay_off_the_screen_unless_asked_and_the_files_keep_them(tmp_path: Path) -> None:
    batch = (b'epoch 0 loss 2.3\nDISTRUN_METRICS {"step": 2, "rank": 0}\nDISTRUN_CHECKSUM {"rank": 0}\n'
             b'a line that names DISTRUN_METRICS inside\n')
    shown = {}
    for asked in (False, True):
        terminal = io.StringIO()
        sink = LogSink(JobDir(tmp_path / str(asked)), Screen(terminal, data_lines=asked))
        host(sink, "node0").on_data(encode(Batch(0, "o", 4, batch)))
        host(sink, "node0").on_data(encode(Batch(1, "o", 1, b'DISTRUN_METRICS {"step": 2, "rank": 1}\n')))
        sink.close()
        shown[asked] = terminal.getvalue().splitlines()

    assert shown[False] == ["[node0 r0] epoch 0 loss 2.3", "[node0 r0] a line that names DISTRUN_METRICS inside"]
    assert len(shown[True]) == 5
    assert "DISTRUN_CHECKSUM" in (tmp_path / "False" / "ranks" / "0.out").read_text(), "the files keep every line"


def test_torchruns_omp_num_threads_banner_shows_from_the_first_host_only(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal))
    glog = "W1127 03:07:05.146000 27221 torch/distributed/run.py:874] "
    banner = "".join(glog + text + "\n" for text in (
        "", "*" * 41, "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
        "your system being overloaded, please further tune the variable for optimal performance in your application "
        "as needed. ", "*" * 41)).encode()
    for node in ("node0", "node1", "node2"):
        host(sink, node).on_data(encode(Batch(None, "e", 4, banner)))
        host(sink, node).on_data(encode(Batch(0, "o", 1, b"epoch 0 loss 2.3\n")))
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert [line.split("]")[0] for line in shown if "run.py:874" in line] == ["[node0 err"] * 4
    assert sum("epoch 0 loss 2.3" in line for line in shown) == 3
    assert "[node1-2] distrun: 8 more lines of torchrun's OMP_NUM_THREADS banner not shown" in terminal.getvalue()


def test_launch_collapse_folds_identical_lines_of_several_ranks_and_keeps_the_rest(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal, collapse=True))
    for node, ranks in (("node0", (0, 1)), ("node1", (2, 3)), ("node2", (4, 5))):
        run = host(sink, node)
        for rank in ranks:
            run.on_data(encode(Batch(rank, "o", 2, b"epoch 1 done\nrank %d only\n" % rank)))
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert shown[0] == "[node0-2 r0-5] epoch 1 done"
    assert sorted(shown[1:]) == sorted(f"[node{r // 2} r{r}] rank {r} only" for r in range(6))


def test_the_tcpstore_warning_and_its_cpp_stack_at_the_exit_barrier_fold_into_one_line(tmp_path: Path) -> None:
    terminal = io.StringIO()
    sink = LogSink(JobDir(tmp_path), Screen(terminal))
    frames = "".join(f"frame #{i}: <unknown function> + 0x{i:x}7a1b (0x7f3e{i:04x} in /venv/lib/libtorch_cpu.so)\n"
                     for i in range(18))
    stack = ("[W1127 03:09:41.512345678 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=5, "
             "addr=[node1]:51234, remote=[node0]:29500): Failed to recv, got 0 bytes. Connection was likely closed. "
             "Did the remote server shutdown or crash?\n"
             "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:682 "
             "(most recent call first):\n" + frames + "\n").encode()
    run = host(sink, "node1")
    run.on_data(encode(Batch(0, "o", 1, b"done\n")))
    run.on_data(encode(Batch(None, "e", 10, stack[:stack.index(b"frame #8")])))  # the stack spans two batches
    run.on_data(encode(Batch(None, "e", 11, stack[stack.index(b"frame #8"):] + b"next line\n")))
    sink.close()

    shown = terminal.getvalue().splitlines()
    assert shown == ["[node1 r0] done", "[node1 err] distrun: c10d's TCPStore warning (recvValueWithTimeout: the "
                     "store's host had ended, as at torchrun's exit barrier) and its C++ stack not shown; the job's "
                     "files keep them", "[node1 err] next line"]
    assert "frame #17" in (tmp_path / "nodes" / "node1.err").read_text(), "the files keep every line"


def test_the_root_causes_last_lines_count_as_shown_only_when_they_were_the_last_the_screen_showed(
        tmp_path: Path) -> None:
    sink = LogSink(JobDir(tmp_path / "a"), Screen(io.StringIO(), job_id="j-7"))
    run = host(sink, "node1")
    run.on_data(encode(Batch(3, "o", 2, b'step 19\nDISTRUN_METRICS {"step": 19, "rank": 3}\n')))
    run.on_data(encode(Batch(3, "e", 8, traceback(3, "ValueError: planted"))))
    assert sink.showed("node1", 3, sink.last_lines("node1", 3, 14)), "a data line kept off the screen does not count"

    run.on_data(encode(Batch(2, "e", 8, traceback(2, "RuntimeError: [gloo] Connection closed by peer"))))
    assert not sink.showed("node1", 2, sink.last_lines("node1", 2, 14)), "another rank's traceback was folded"
    sink.failed_rank("node1", 2)
    assert sink.showed("node1", 2, sink.last_lines("node1", 2, 14)), "once released, it is on the screen"

    detached = LogSink(JobDir(tmp_path / "b"))
    host(detached, "node1").on_data(encode(Batch(3, "e", 8, traceback(3, "ValueError: planted"))))
    assert not detached.showed("node1", 3, detached.last_lines("node1", 3, 14)), "no screen: nothing was shown"
    sink.close()
    detached.close()
