"""`distrun logs` on a job directory written as the launcher writes it: filters intersect, one
format, the summary never grepped, --tail after filtering, --since, --attempt, --collapse, -f,
and --recover's rebuild from the hosts' copies."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.logs import LogsRequest, show_logs
from orchestrator.cli.timespec import parse_since
from orchestrator.errors import UsageError
from orchestrator.liveness import process_start
from orchestrator.logs import recover as recover_module
from orchestrator.logs.format import note, rank_prefixes, stamp
from orchestrator.logs.query import parse_ranks
from orchestrator.logs.recover import FetchedCopy, rebuild
from orchestrator.remote.linestore import INDEX, IndexEntry, LineStore, parse_entry
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun

T0 = 1_800_000_000.0  # when the job's first line arrived
JOB = "demo-1"


def put(root: Path, t: float, node: str, rank: int | None, stream: str, text: str, attempt: int = 1,
        partial: bool = False) -> None:
    data = text.encode()
    store = LineStore(str(root))
    store.append(IndexEntry(t, attempt, node, rank, stream, data.count(b"\n"), len(data), partial), data)
    store.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished 2-host x 2-rank job: node0 has ranks 0-1, node1 ranks 2-3."""
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path))
    store = Store()
    store.save(JobRecord(id=JOB, name="demo", spec_path="j.yaml", inventory="inv.yaml", hosts=["node0", "node1"],
                         state=JobState.RUNNING))
    root = store.job_dir(JOB).root
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"world_size": 4}))
    put(root, T0, "node0", 0, "o", "step 1 loss 2.0\n")
    put(root, T0 + 0.1, "node1", 2, "o", "step 1 loss 2.0\n")
    put(root, T0 + 0.2, "node0", 1, "o", "step 1 loss 2.0\n")
    put(root, T0 + 0.3, "node1", 3, "o", "step 1 loss 2.0\n")
    put(root, T0 + 10, "node1", 2, "e", "warning: slow\n")
    put(root, T0 + 20, "node0", None, "e", "torchrun: worker 1 failed\n")
    put(root, T0 + 21, "node0", None, "d", "distrun: stopping (node0 failed)\n")
    put(root, T0 + 30, "node1", 3, "o", "step 2 loss 1.5\n", attempt=2)
    put(root, T0 + 31, "node1", 3, "o", "half\n", attempt=2, partial=True)  # the supervisor ended it
    store.end(JOB, JobState.FAILED, 1, "job demo-1 FAILED\nRoot Cause (first observed failure):\n  rank: 3 step")
    return tmp_path


def logs(**asked: object) -> str:
    out = io.StringIO()
    code = show_logs(LogsRequest(job_ref=JOB, **asked), out)  # type: ignore[arg-type]
    assert code == 0
    return out.getvalue()


def test_every_line_in_arrival_order_in_one_format_then_the_summary(home: Path) -> None:
    assert logs().splitlines() == [
        "[node0 r0] step 1 loss 2.0", "[node1 r2] step 1 loss 2.0", "[node0 r1] step 1 loss 2.0",
        "[node1 r3] step 1 loss 2.0", "[node1 r2 err] warning: slow", "[node0 err] torchrun: worker 1 failed",
        "[node0] distrun: stopping (node0 failed)", "--- attempt 2 ---", "[node1 r3] step 2 loss 1.5",
        "[node1 r3 partial] half", "job demo-1 FAILED", "Root Cause (first observed failure):", "  rank: 3 step",
    ]


def test_node_and_rank_filters_intersect(home: Path) -> None:
    assert logs(nodes=("node1",), ranks=("0",)) == ""
    assert logs(nodes=("node1",), ranks=("2",)).splitlines() == ["[node1 r2] step 1 loss 2.0",
                                                                "[node1 r2 err] warning: slow"]


def test_filters_that_match_no_line_say_so_on_stderr_and_exit_0(home: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert logs(ranks=("1",), grep="loss 9") == ""
    assert capsys.readouterr().err == "no line of job demo-1 matches --rank 1 --grep 'loss 9'\n"
    assert logs(nodes=("node1",), ranks=("0",)) == ""
    assert "matches --node node1 --rank 0" in capsys.readouterr().err
    assert logs(ranks=("1",), grep="loss") != ""
    assert capsys.readouterr().err == ""


def test_repeated_and_comma_separated_ranks_accumulate(home: Path) -> None:
    shown = logs(ranks=("0", "2,1"), grep="step")
    assert shown.splitlines() == ["[node0 r0] step 1 loss 2.0", "[node1 r2] step 1 loss 2.0",
                                  "[node0 r1] step 1 loss 2.0"]


def test_a_rank_the_job_does_not_have_is_an_error_like_an_unknown_node(home: Path) -> None:
    with pytest.raises(UsageError, match=r"--rank 99: job demo-1 has ranks 0-3"):
        logs(ranks=("99",))
    with pytest.raises(UsageError, match=r"--node node9: job demo-1 ran on node\[0-1\]"):
        logs(nodes=("node9",))
    with pytest.raises(UsageError, match=r"--rank x: 'x' is not a rank number"):
        logs(ranks=("x",))


def test_grep_matches_the_lines_text_and_never_the_stored_summary(home: Path) -> None:
    assert logs(grep="step").splitlines() == [
        "[node0 r0] step 1 loss 2.0", "[node1 r2] step 1 loss 2.0", "[node0 r1] step 1 loss 2.0",
        "[node1 r3] step 1 loss 2.0", "--- attempt 2 ---", "[node1 r3] step 2 loss 1.5"]
    assert logs(grep="Root Cause|FAILED") == ""
    assert logs(grep="^node") == "", "the label is not part of the text"


def test_tail_gives_the_last_lines_after_the_other_filters(home: Path) -> None:
    assert logs(ranks=("3",), tail=2).splitlines() == ["[node1 r3] step 2 loss 1.5", "[node1 r3 partial] half"]
    assert logs(nodes=("node0",), stderr=True, tail=5).splitlines() == ["[node0 err] torchrun: worker 1 failed"]


def test_stderr_keeps_only_what_was_written_to_stderr(home: Path) -> None:
    assert logs(stderr=True).splitlines() == ["[node1 r2 err] warning: slow", "[node0 err] torchrun: worker 1 failed"]


def test_since_uses_each_lines_arrival_time(home: Path) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(T0 + 25))
    assert logs(since=since, bare=True).splitlines() == ["step 2 loss 1.5", "half"]


def test_attempt_keeps_that_attempts_lines_and_an_attempt_the_job_lacks_is_an_error(home: Path) -> None:
    assert logs(attempt=2, bare=True).splitlines() == ["step 2 loss 1.5", "half"]
    with pytest.raises(UsageError, match=r"--attempt 3: job demo-1 has attempt\(s\) 1, 2"):
        logs(attempt=3)


def test_bare_and_timestamps_change_only_the_prefix(home: Path) -> None:
    first = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(T0))
    assert logs(ranks=("0",), bare=True) == "step 1 loss 2.0\n"
    assert logs(ranks=("0",), timestamps=True) == f"{first}.000 [node0 r0] step 1 loss 2.0\n"


def test_a_stamp_never_reads_before_the_millisecond_a_line_arrived_in() -> None:
    """A rank's line printed at 12:00:00.123 and kept at once in the index was stamped .122 (the
    fraction of a float cut, not counted): the stamp read before the time written in the line."""
    for millis in range(1000):
        arrived = parse_entry(IndexEntry(1764223200 + millis / 1000, 1, "node0", 0, "o", 1, 5).line()).time
        assert stamp(arrived).endswith(f".{millis:03d}"), arrived


def test_collapse_folds_identical_lines_of_several_ranks_into_one(home: Path) -> None:
    assert logs(collapse=True, grep="step").splitlines() == [
        "[node0-1 r0-3] step 1 loss 2.0", "--- attempt 2 ---", "[node1 r3] step 2 loss 1.5"]


def test_control_characters_from_a_host_are_escaped(home: Path) -> None:
    root = Store().job_dir(JOB).root
    put(root, T0 + 40, "node0", 0, "o", "title \x1b]0;owned\x07 clear \x1b[2J tab\tkept \u009b csi\n")

    assert logs(ranks=("0",), tail=1) == "[node0 r0] title \\x1b]0;owned\\x07 clear \\x1b[2J tab\tkept \\x9b csi\n"
    assert b"\x1b]0;owned\x07" in (root / "ranks" / "0.out").read_bytes(), "files keep the bytes as they came"


@pytest.fixture
def controller() -> Iterator[int]:
    """A live process that passes for a job's controller (its command line names distrun's package)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "orchestrator-test-controller"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_follow_prints_lines_as_they_come_and_exits_with_the_jobs_exit_code(home: Path, controller: int) -> None:
    store = Store()
    root = store.job_dir("run-2").root
    store.save(JobRecord(id="run-2", name="r", spec_path="", inventory="", hosts=["node0"], state=JobState.RUNNING,
                         controller_pid=controller, controller_start=process_start(controller)))
    put(root, time.time(), "node0", 0, "o", "before\n")
    out = io.StringIO()
    result: list[int] = []
    follower = threading.Thread(target=lambda: result.append(show_logs(LogsRequest("run-2", follow=True), out)))
    follower.start()
    time.sleep(0.5)
    put(root, time.time(), "node0", 0, "o", "while running\n")
    put(root, time.time(), "node0", 0, "o", "step 2\n", attempt=2)
    time.sleep(0.5)
    assert follower.is_alive()
    store.end("run-2", JobState.FAILED, 7, "job run-2 FAILED")
    follower.join(10)

    assert result == [7]
    assert out.getvalue().splitlines() == ["[node0 r0] before", "[node0 r0] while running", "--- attempt 2 ---",
                                           "[node0 r0] step 2", "job run-2 FAILED"]


def test_follow_keeps_c10ds_hostname_warning_off_the_screen_as_launch_does(home: Path, controller: int) -> None:
    store = Store()
    root = store.job_dir("run-3").root
    store.save(JobRecord(id="run-3", name="r", spec_path="", inventory="", hosts=["node0", "node1"],
                         state=JobState.RUNNING, controller_pid=controller, controller_start=process_start(controller)))
    warning = "[W socket.cpp:767] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n"
    for node, rank in (("node0", 0), ("node1", 1)):
        put(root, time.time(), node, rank, "e", warning + warning + "real error\n")
    store.end("run-3", JobState.FAILED, 1, "job run-3 FAILED")
    out = io.StringIO()

    assert show_logs(LogsRequest("run-3", follow=True), out) == 1
    shown = out.getvalue()
    assert "cannot be retrieved" not in shown and shown.count("real error") == 2
    plain = io.StringIO()
    show_logs(LogsRequest("run-3"), plain)
    assert plain.getvalue().count("cannot be retrieved. err=-3") == 4, "without -f every line shows"


def test_since_takes_durations_clock_times_and_dates_and_refuses_the_rest() -> None:
    now = 1_800_000_000.0
    assert parse_since("90s", now=now) == now - 90 and parse_since("2h", now=now) == now - 7200
    assert parse_since("2w", now=now) == parse_since("14 d", now=now) == now - 14 * 86400
    assert parse_since("2026-11-21T14:30", now=now) == time.mktime((2026, 11, 21, 14, 30, 0, 0, 0, -1))
    assert parse_since("2026-11-21", now=now) == time.mktime((2026, 11, 21, 0, 0, 0, 0, 0, -1))
    assert 0 <= now - parse_since("00:00", now=now) < 86400
    with pytest.raises(UsageError, match="--since 'yesterday': not a time"):
        parse_since("yesterday", now=now)


SINCE_TEXTS = ("90s", "2 h", "7d", "2w", "1.5h", "14:30", "14:30:05", "2026-11-21", "2026-11-21 14:30",
               "2026-11-21T14:30:05")


@pytest.mark.parametrize("text", [*SINCE_TEXTS, "yesterday", "14h30"])
def test_ps_and_logs_since_accept_the_same_strings(home: Path, text: str) -> None:
    ps = distrun("ps", "--since", text, home=home)
    shown = distrun("logs", JOB, "--since", text, home=home)
    codes = (ps.returncode, shown.returncode)
    assert codes == ((0, 0) if text in SINCE_TEXTS else (2, 2)), (ps.stderr, shown.stderr)
    if text not in SINCE_TEXTS:
        assert f"--since {text!r}: not a time" in ps.stderr and f"--since {text!r}: not a time" in shown.stderr


def test_rank_values_accumulate_over_repeats_and_commas() -> None:
    assert parse_ranks(["1", "3,5", " 2 "]) == frozenset({1, 2, 3, 5}) and parse_ranks([]) is None


def test_a_bad_grep_is_one_clear_error(home: Path) -> None:
    with pytest.raises(UsageError, match=re.escape("--grep '(': not a regular expression")):
        logs(grep="(")


def host_copy(tmp_path: Path, node: str, lines: list[tuple[float, int, str, str]]) -> FetchedCopy:
    """A host's copy of its lines (time, rank, stream, text), as the supervisor writes it."""
    root = tmp_path / f"copy-{node}"
    for t, rank, stream, text in lines:
        put(root, t, node, rank, stream, text)
    return FetchedCopy({str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()})


def job_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_recover_takes_a_hosts_lines_from_its_copy_in_time_order_and_keeps_the_rest(home: Path, tmp_path: Path) -> None:
    """node1's copy holds a line the controller never got; node0 (no copy) and distrun's notes
    keep what the controller had, the summary stays."""
    copy = host_copy(tmp_path, "node1", [(T0 + 0.1, 2, "o", "step 1 loss 2.0\n"),
                                         (T0 + 0.3, 3, "o", "step 1 loss 2.0\n"),
                                         (T0 + 10, 2, "e", "warning: slow\n"),
                                         (T0 + 20.5, 3, "e", "Traceback: lost on the way\n")])
    counts = rebuild(Store().job_dir(JOB), {"node1": copy})

    assert counts == {"node1": 4}
    assert logs().splitlines() == [
        "[node0 r0] step 1 loss 2.0", "[node1 r2] step 1 loss 2.0", "[node0 r1] step 1 loss 2.0",
        "[node1 r3] step 1 loss 2.0", "[node1 r2 err] warning: slow", "[node0 err] torchrun: worker 1 failed",
        "[node1 r3 err] Traceback: lost on the way", "[node0] distrun: stopping (node0 failed)",
        "job demo-1 FAILED", "Root Cause (first observed failure):", "  rank: 3 step",
    ]
    assert not (Store().job_dir(JOB).root / recover_module.STAGING).exists()


def test_a_recover_that_cannot_write_leaves_the_jobs_files_as_they_were(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Store().job_dir(JOB).root
    before = job_files(root)
    copy = host_copy(tmp_path, "node1", [(T0 + 0.1, 2, "o", "from the copy\n")])

    class FullDisk(LineStore):
        def flush(self) -> None:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(recover_module, "LineStore", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        rebuild(Store().job_dir(JOB), {"node1": copy})

    assert job_files(root) == before
    assert INDEX in before


def test_recover_refuses_a_running_job_and_touches_none_of_its_files(home: Path, controller: int) -> None:
    store = Store()
    store.save(JobRecord(id="run-3", name="r", spec_path="", inventory="", hosts=["node0"], state=JobState.RUNNING,
                         controller_pid=controller, controller_start=process_start(controller)))
    root = store.job_dir("run-3").root
    put(root, time.time(), "node0", 0, "o", "being written\n")
    before = job_files(root)

    with pytest.raises(UsageError, match=r"--recover: job run-3 is still running; .*distrun stop run-3"):
        show_logs(LogsRequest("run-3", recover=True), io.StringIO())
    assert job_files(root) == before


def test_a_note_and_a_ranks_prefixes_read_as_the_screen_shows_them() -> None:
    assert note("node1", "workdir synced") == "[node1] distrun: workdir synced"
    assert rank_prefixes("node1", 0) == ("[node1 r0] ", "[node1 r0 err] ")
