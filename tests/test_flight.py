"""Flight Recorder dumps of a hung job: the analysis (orchestrator/diagnose/flight.py), the ranks' socket
directory and the fetch over a Unix socket (orchestrator/remote/flightrec.py).

tests/data/flight/rank<R>.json are real fr_trace_json answers of a 3-rank gloo job (torch 2.13,
TORCH_FR_BUFFER_SIZE=2000) whose rank 1 slept before the 4th all_reduce, fetched while it hung.
The fetch test serves a real torch worker server from a one-rank gloo process; the diagnosis test
hangs two real gloo ranks (plain processes with a rank's environment, no torchrun) and dumps them
through the local backend, py-spy included, as tests/test_stack.py does.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.diagnose.flight import Lag, lags
from orchestrator.diagnose.watchdog import diagnose
from orchestrator.remote.flightrec import fetch
from orchestrator.remote.sockdir import MAX_SOCKET_PATH, socket_dir, socket_path
from orchestrator.run.recorded import for_record
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import ready_processes, record_this_process_as_the_jobs_root, wait_for
from tests.test_supervisor_lifecycle import config, run_shipped

DATA = Path(__file__).parent / "data" / "flight"


def real_dumps() -> dict[int, dict[str, Any]]:
    return {rank: json.loads((DATA / f"rank{rank}.json").read_text()) for rank in range(3)}


def entry(seq: int, retired: bool, group: tuple[str, str] = ("0", "default_pg"),
          name: str = "gloo:all_reduce") -> dict[str, Any]:
    """An entry shaped as the real ones are (rank 0's first, its identity changed)."""
    raw = copy.deepcopy(real_dumps()[0]["entries"][0])
    raw.update(collective_seq_id=seq, record_id=seq - 1, op_id=seq, retired=retired, process_group=list(group),
               profiling_name=name)
    return raw


def dump_upto(last: int, pending: bool, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A rank that completed collectives 1..last (the last one still pending when `pending`)."""
    dump = copy.deepcopy(real_dumps()[0])
    dump["entries"] = [entry(seq, retired=not (pending and seq == last)) for seq in range(1, last + 1)]
    dump["entries"] += extra or []
    return dump


def test_the_real_dumps_name_rank_1_which_has_not_entered_the_all_reduce_ranks_0_and_2_wait_in():
    found = lags(real_dumps())
    assert found == [Lag("0", "default_pg", 4, "gloo:all_reduce", (0, 2), (1,), (3,))]
    assert found[0].line() == ("rank 1 has not entered collective #4 gloo:all_reduce that ranks 0,2 wait in "
                               "(last entered: #3)")


def test_of_six_ranks_rank_3_is_named_behind_collective_31_that_the_five_others_wait_in():
    dumps = {rank: dump_upto(30, pending=False) if rank == 3 else dump_upto(31, pending=True) for rank in range(6)}
    assert [lag.line() for lag in lags(dumps)] == [
        "rank 3 has not entered collective #31 gloo:all_reduce that ranks 0-2,4-5 wait in (last entered: #30)"]


def test_the_collective_most_ranks_wait_in_wins_over_a_later_one_a_single_rank_entered():
    # Rank 5 ran ahead into #32 (a mismatched schedule); the others wait in #31 but rank 0 never entered it.
    dumps = {0: dump_upto(30, False), 1: dump_upto(31, True), 2: dump_upto(31, True), 5: dump_upto(32, True)}
    (lag,) = lags(dumps)
    assert (lag.seq, lag.waiting, lag.behind, lag.last) == (31, (1, 2), (0,), (30,))


def test_a_rank_that_entered_no_collective_is_behind_from_zero():
    dumps = {0: dump_upto(4, True), 1: {**dump_upto(0, False)}, 2: dump_upto(4, True)}
    (lag,) = lags(dumps)
    assert (lag.behind, lag.last) == ((1,), (0,))
    assert lag.line().endswith("(last entered: #0)")


def test_every_rank_in_the_same_collective_is_said_with_no_rank_behind():
    (lag,) = lags({rank: dump_upto(7, pending=True) for rank in range(3)})
    assert lag.line() == "ranks 0-2 wait in collective #7 gloo:all_reduce: no rank is behind"


def test_a_job_whose_collectives_all_completed_has_nothing_to_say():
    assert lags({rank: dump_upto(9, pending=False) for rank in range(4)}) == []
    assert lags({}) == []


def test_a_subgroup_is_analysed_apart_with_its_name_and_only_its_members():
    sub = ("1", "tp_group")
    dumps = {
        0: dump_upto(5, False, [entry(1, True, sub), entry(2, False, sub, "gloo:broadcast")]),
        1: dump_upto(5, False, [entry(1, True, sub)]),
        2: dump_upto(5, False),  # not a member of tp_group: never behind in it
    }
    assert [lag.line() for lag in lags(dumps)] == [
        "rank 1 has not entered collective #2 gloo:broadcast of process group tp_group that rank 0 waits in "
        "(last entered: #1)"]


def test_a_hang_failure_keeps_its_flight_recorder_lags_through_the_record_and_shows_them():
    lag = lags(real_dumps())[0]
    failure = Failure("node0", FailureKind.HANG, rank=1, reason="hang: no progress", flight=(lag,))
    again = Failure.from_dict(json.loads(json.dumps(failure.to_dict())))
    assert again == failure
    assert ("  flight recorder: rank 1 has not entered collective #4 gloo:all_reduce that ranks 0,2 wait in "
            "(last entered: #3)") in again.render().splitlines()


def test_a_record_written_before_the_flight_recorder_reads_back_with_no_lags():
    old = {"host": "node1", "kind": "hang", "rank": 3, "reason": "hang", "stack": ["stack of rank 3:"]}
    assert Failure.from_dict(old).flight == ()


@pytest.fixture
def own_tmp() -> Iterator[Path]:
    """A directory with a short path (pytest's are too long for Unix sockets)."""
    path = Path(tempfile.mkdtemp(prefix="fr"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_socket_dir_is_made_under_home_when_short_enough(own_tmp, monkeypatch):
    monkeypatch.setenv("HOME", str(own_tmp))
    made = socket_dir("~/.distrun/jobs/j-1/sock", "j-1")
    assert made == str(own_tmp / ".distrun" / "jobs" / "j-1" / "sock")
    assert os.stat(made).st_mode & 0o777 == 0o700


def test_a_socket_dir_too_long_for_a_unix_socket_falls_back_to_a_short_private_one_that_binds(own_tmp, monkeypatch):
    monkeypatch.setenv("HOME", str(own_tmp / ("h" * 90)))
    made = socket_dir("~/.distrun/jobs/resnet50-20261121-143012-a3f9c2/sock", "resnet50-20261121-143012-a3f9c2")
    try:
        assert made is not None and not made.startswith(str(own_tmp))
        longest = socket_path(made, 99999)
        assert len(longest) <= MAX_SOCKET_PATH
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(longest)  # the real limit, not ours: this raises when the path is too long
        assert os.stat(made).st_mode & 0o777 == 0o700
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)


def test_the_supervisor_removes_the_short_socket_dir_it_made_when_the_job_ends(own_tmp, tmp_path, monkeypatch):
    """The shipped supervisor, a job asking for a socket dir too long for a socket path: the ranks
    get a short one under the temporary directory, and it is gone once the job has ended."""
    monkeypatch.setenv("TMPDIR", str(own_tmp))  # where the supervisor's fallback goes
    wanted = str(tmp_path / ("s" * 100) / "sock")
    show = "import os; d = os.environ['DISTRUN_WORKER_SOCKETS']; print(d, os.path.isdir(d))"
    lines, _ = run_shipped(config(tmp_path, [sys.executable, "-c", show], env={"DISTRUN_WORKER_SOCKETS": wanted}))
    made, existed = lines[-1].split()
    assert made.startswith(str(own_tmp / "distrun-")) and existed == "True"
    assert not os.path.exists(made) and not os.listdir(own_tmp)


def test_no_socket_dir_is_given_when_even_the_short_one_would_be_too_long(own_tmp, monkeypatch):
    monkeypatch.setenv("HOME", str(own_tmp / ("h" * 90)))
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp / ("t" * 90)))  # where the fallback goes
    assert socket_dir("~/.distrun/jobs/j-1/sock", "j-1") is None


SERVING_RANK = """\
import os, sys, torch, torch.distributed as dist
from torch.distributed.elastic.control_plane import worker_main
os.environ["TORCH_WORKER_SERVER_SOCKET"] = sys.argv[1]
with worker_main():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for _ in range(3):
        dist.all_reduce(torch.ones(1))
    print("ready", flush=True)
    sys.stdin.read()
"""


def fetch_from(program: str, path: str) -> dict[str, object]:
    """What `fetch` gets from a real rank running `program`, serving on `path`, once it is ready."""
    rank = subprocess.Popen([sys.executable, "-c", program, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, "TORCH_FR_BUFFER_SIZE": "100"}, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        return fetch(path)
    finally:
        rank.kill()
        rank.wait()


def test_fetch_gets_a_live_ranks_dump_and_says_why_for_a_missing_or_dead_socket(own_tmp):
    path = str(own_tmp / "rank0.sock")
    got = fetch_from(SERVING_RANK, path)
    entries = got["flight"]["entries"]  # type: ignore[index]
    assert [(e["collective_seq_id"], e["profiling_name"], e["retired"]) for e in entries] == [
        (1, "gloo:all_reduce", True), (2, "gloo:all_reduce", True), (3, "gloo:all_reduce", True)]
    assert fetch(str(own_tmp / "rank7.sock")) == {"flight_error": "no socket served"}
    assert fetch(path)["flight_error"].startswith("ConnectionRefusedError")  # the dead rank's file is left


NCCL_RANK = """\
import json, os, sys, torch
from torch._C._distributed_c10d import _register_handler
from torch.distributed.elastic.control_plane import worker_main

def nccl_record(request, response):  # NCCL's record under its handler, as a CUDA build serves it
    entry = {"collective_seq_id": 5, "profiling_name": "nccl:all_reduce", "state": "completed",
             "time_created_ns": 1000, "time_discovered_completed_ns": 2000, "process_group": ["0", "default_pg"]}
    asked = request.get_param("includecollectives")
    response.set_content(json.dumps({"version": "2.10", "asked": asked, "entries": [entry]}), "application/json")

_register_handler("dump_nccl_trace_json", nccl_record)
os.environ["TORCH_WORKER_SERVER_SOCKET"] = sys.argv[1]
with worker_main():
    print("ready", flush=True)
    sys.stdin.read()
"""


def test_fetch_reads_nccls_record_when_the_cpu_record_has_no_collective(own_tmp):
    """On NCCL, torch's `fr_trace_json` has no entries (a lent H200, torch 2.11): the rank's record is
    behind `dump_nccl_trace_json`. A real rank serves an NCCL-shaped record under that handler."""
    flight = fetch_from(NCCL_RANK, str(own_tmp / "rank0.sock"))["flight"]
    assert flight["asked"] == "true"  # type: ignore[index]
    assert [e["profiling_name"] for e in flight["entries"]] == ["nccl:all_reduce"]  # type: ignore[index]


HUNG_RANK = """\
import os, sys, time, torch, torch.distributed as dist
from torch.distributed.elastic.control_plane import worker_main

def load_batch():
    print("ready", flush=True)
    time.sleep(120)

sockets = os.environ["DISTRUN_WORKER_SOCKETS"]
os.environ["TORCH_WORKER_SERVER_SOCKET"] = os.path.join(sockets, "rank%s.sock" % os.environ["RANK"])
with worker_main():
    dist.init_process_group("gloo")
    for step in range(4):
        if step == 3:
            if dist.get_rank() == 1:
                load_batch()
            print("ready", flush=True)
        dist.all_reduce(torch.ones(1))
"""


def entered(path: str, seq: int) -> bool:
    """Whether the rank serving `path` has entered its `seq`th collective, by its own Flight Recorder."""
    flight = fetch(path).get("flight") or {}
    return any(entry["collective_seq_id"] == seq for entry in flight.get("entries", []))  # type: ignore[union-attr]


@pytest.fixture
def hung_pair(tmp_path: Path, own_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, JobRecord]]:
    """Two gloo ranks recorded as a running local job: rank 1 sleeps before the 4th all_reduce, which
    rank 0 waits in; both serve their Flight Recorder in DISTRUN_WORKER_SOCKETS. This test process
    stands for their supervisor: it is recorded as their root."""
    store = Store(tmp_path / "home")
    rec = JobRecord(id="fr-1", name="fr", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                    backend="local", state=JobState.RUNNING)
    store.save(rec)
    monkeypatch.setenv("HOME", str(tmp_path))
    record_this_process_as_the_jobs_root(tmp_path, rec.id, "localhost")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    envs = [{**os.environ, "DISTRUN_JOB_ID": rec.id, "DISTRUN_NODE": "localhost", "RANK": str(rank),
             "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "DISTRUN_WORKER_SOCKETS": str(own_tmp), "TORCH_FR_BUFFER_SIZE": "100"} for rank in range(2)]
    with ready_processes([([sys.executable, "-c", HUNG_RANK], env) for env in envs]):
        assert wait_for(lambda: entered(socket_path(str(own_tmp), 0), 4), 30)
        yield store, rec


def test_diagnose_fetches_every_ranks_flight_recorder_keeps_it_and_names_the_rank_behind(hung_pair):
    store, rec = hung_pair
    job_dir = store.job_dir(rec.id)
    failure = diagnose(for_record(store, rec), rec, job_dir, 15, {"localhost": "127.0.0.1"})
    assert (failure.kind, failure.rank) == (FailureKind.HANG, 1)
    assert failure.flight == (Lag("0", "default_pg", 4, "gloo:all_reduce", (0,), (1,), (3,)),)
    assert ("  flight recorder: rank 1 has not entered collective #4 gloo:all_reduce that rank 0 waits in "
            "(last entered: #3)") in failure.render().splitlines()
    assert sorted(p.name for p in job_dir.flight.iterdir()) == ["flight.json", "rank0.json", "rank1.json"]
    kept = json.loads((job_dir.flight / "flight.json").read_text())
    assert kept["errors"] == {} and 0 < kept["seconds"] < 5


@pytest.mark.parametrize("planted", ["another users directory", "a link to another users directory"])
def test_a_fallback_directory_another_user_made_first_neither_blocks_nor_redirects_the_sockets(
        own_tmp, monkeypatch, planted):
    monkeypatch.setenv("HOME", str(own_tmp / ("h" * 90)))
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    theirs = own_tmp / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    base = own_tmp / f"distrun-{os.getuid()}"  # where the fallback used to go, made before the job
    if planted == "another users directory":
        base.mkdir(mode=0o777)
        os.chown(base, 65534, 65534)
    else:
        base.symlink_to(theirs)
    made = socket_dir("~/.distrun/jobs/j-1/sock", "j-1")
    assert made is not None and os.path.realpath(made) == made
    info = os.lstat(made)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o700)
    assert not made.startswith(str(base)) and list(theirs.iterdir()) == []
