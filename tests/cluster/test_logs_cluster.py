"""A job's lines on real hosts (3 namespace hosts x 2 ranks, real sshd and torchrun): whole, once,
with the right rank; secrets masked and escapes escaped; noise folded; `logs -f`; `--recover`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, distrun, job_lines, wait_for

WORKER = Path(__file__).parent / "jobs" / "logs_worker.py"
LINES = 100_000
SECRET = "s3cr3t-7e1d"
RANK_LABEL = re.compile(r"\[node\d r\d\] ")


def write_job(tmp_path: Path, name: str, args: list[str], env: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nscript: {WORKER}\nargs: {json.dumps(args)}\nnproc_per_node: 2\n"
                    f"env: {{OMP_NUM_THREADS: '1'{env}}}\ntelemetry: {{enabled: false}}\nheartbeat_timeout: 10\n"
                    "stop_grace: 3\n")
    return path


def record(home: Path, job_id: str) -> dict:
    return next(r for r in json.loads(distrun("ps", "--json", "--all", home=home).stdout) if r["id"] == job_id)


@pytest.fixture(scope="module")
def ids() -> Iterator[dict[str, str]]:
    """Job ids of this run, unique: the hosts' copies live in the one ~/.distrun that every namespace
    host shares, where a copy of an earlier run under the same id would be added to. Removed at the end."""
    suffix = uuid.uuid4().hex[:6]
    made = {"flood": f"flood-{suffix}", "fail": f"fail-{suffix}", "stall": f"stall-{suffix}"}
    yield made
    for job_id in made.values():
        shutil.rmtree(Path(f"~/.distrun/jobs/{job_id}").expanduser(), ignore_errors=True)


@pytest.fixture(scope="module")
def inv(cluster3, tmp_path_factory) -> Path:
    return cluster3.write_inventory(tmp_path_factory.mktemp("inv") / "inv.yaml")


@pytest.fixture(scope="module")
def flood(cluster3, inv, ids, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """6 ranks print() 100,000 numbered lines each under `python -u`, after a secret and escapes,
    and end on a partial line."""
    tmp = tmp_path_factory.mktemp("flood")
    job = write_job(tmp, "flood", ["--lines", str(LINES), "--secret-from", "TOKEN"], ", TOKEN: '${env:SRC}'")
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", ids["flood"], home=tmp / "home",
                     env={"SRC": SECRET}, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp / "home", result


def test_every_printed_line_arrives_whole_exactly_once_with_the_right_rank(flood, ids) -> None:
    home, result = flood
    job_dir = home / "jobs" / ids["flood"]
    for rank in range(6):
        lines = (job_dir / "ranks" / f"{rank}.out").read_text().splitlines()
        assert lines[1:-1] == [f"rank {rank} line {i}" for i in range(LINES)], f"rank {rank}'s file"
    # A rank's line, whole or spliced, carries a rank label; torchrun's own (its agent's "line 201"
    # of a traceback in the exit barrier, when the master's store went first) does not.
    shown = Counter(line for line in result.stdout.splitlines() if RANK_LABEL.match(line) and " line " in line)
    expected = {f"[node{r // 2} r{r}] rank {r} line {i}" for r in range(6) for i in range(LINES)}
    assert set(shown) == expected and set(shown.values()) == {1}, "on screen: each line once, whole, rightly labelled"


def test_a_partial_last_line_at_exit_is_kept_and_marked(flood, ids) -> None:
    home, result = flood
    for rank in range(6):
        assert f"[node{rank // 2} r{rank} partial] partial {rank} without newline" in result.stdout
        tail = distrun("logs", ids["flood"], "--rank", str(rank), "--tail", "1", home=home).stdout
        assert tail == f"[node{rank // 2} r{rank} partial] partial {rank} without newline\n"


def test_a_printed_secret_is_masked_on_screen_in_the_job_files_and_in_the_hosts_copies(flood, ids) -> None:
    home, result = flood
    assert SECRET not in result.stdout + result.stderr
    assert "[node1 r3] token *** title \\x1b]0;owned\\x07 clear \\x1b[2J end" in result.stdout
    assert "\x1b]0;" not in result.stdout, "no escape sequence from a host reaches the terminal"
    copies = Path(f"~/.distrun/jobs/{ids['flood']}").expanduser()
    # Each host's copy, beside the shipped programs (bin/) and the ranks' Flight Recorder sockets (sock/).
    assert {p.name for p in copies.iterdir() if p.is_dir()} == {"node0", "node1", "node2", "bin", "sock"}
    for root in (home, copies):
        for path in root.rglob("*"):
            assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    assert not list(copies.glob("*/torchrun")), "torchrun's own (unmasked) files are gone"
    assert b"\x1b]0;owned\x07" in (copies / "node1" / "ranks" / "3.out").read_bytes(), "files keep the bytes"


@pytest.fixture(scope="module")
def failed(cluster3, inv, ids, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Rank 3 prints a line and raises; the other hosts tick until distrun stops them."""
    tmp = tmp_path_factory.mktemp("failed")
    job = write_job(tmp, "fail", ["--ticks", "100", "--fail-rank", "3"])
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", ids["fail"], home=tmp / "home", timeout=300)
    assert result.returncode == 1, result.stdout[-3000:]
    return tmp / "home", result


def test_the_line_a_rank_printed_before_raising_comes_before_its_traceback_in_the_summary(failed, ids) -> None:
    home, _ = failed
    (root,) = record(home, ids["fail"])["failures"][:1]
    assert (root["host"], root["rank"]) == ("node1", 3)
    last = root["last_lines"]
    assert last.index("the last words") < last.index("Traceback (most recent call last):")
    assert last[-1] == "RuntimeError: deliberate failure"
    shown = distrun("logs", ids["fail"], "--rank", "3", "--bare", home=home).stdout.splitlines()
    assert shown.index("the last words") < shown.index("Traceback (most recent call last):")


def test_what_distruns_stop_makes_the_hosts_print_is_folded_to_one_line_per_host_on_screen(failed, ids) -> None:
    home, result = failed
    assert "SignalException" not in result.stdout.split(f"job {ids['fail']} FAILED")[0]
    folded = [line for line in result.stdout.splitlines() if " of shutdown output " in line]
    assert 1 <= len(folded) <= 3 and all(re.fullmatch(rf"\[node[0-2]\] \d+ lines? of shutdown output \(distrun logs "
                                                      rf"{ids['fail']} --node node[0-2]\)", f) for f in folded), folded
    assert "SignalException" in job_lines(home / "jobs" / ids["fail"]), "the files keep everything"


def test_recover_of_a_finished_job_keeps_its_summary_and_every_ranks_order(failed, ids) -> None:
    home, _ = failed
    before = distrun("logs", ids["fail"], home=home).stdout
    result = distrun("logs", ids["fail"], "--recover", home=home)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("recovered") == 3
    after = result.stdout
    assert after.endswith(before[before.index(f"job {ids['fail']} FAILED"):]), "the summary is still shown last"
    for rank in range(6):
        mine = [ln for ln in before.splitlines() if ln.startswith(f"[node{rank // 2} r{rank}")]
        assert [ln for ln in after.splitlines() if ln.startswith(f"[node{rank // 2} r{rank}")] == mine
    assert sorted(before.splitlines()) == sorted(after.splitlines())


def test_logs_follow_exits_with_the_jobs_exit_code_and_recover_refuses_a_running_job(cluster3, inv, ids,
                                                                                      tmp_path) -> None:
    home = tmp_path / "home"
    # Rank 5 fails at its 12th tick, a few seconds in: --recover is tried while the job runs.
    job = write_job(tmp_path, "det", ["--ticks", "40", "--tick-every", "0.25", "--fail-rank", "5", "--fail-at", "12"])
    detached = distrun("launch", str(job), "-i", str(inv), "--detach", home=home, timeout=120)
    assert detached.returncode == 0, detached.stderr
    job_id = detached.stdout.strip().splitlines()[-1]
    ids["detached"] = job_id  # its hosts' copies are removed with the others'
    env = {**os.environ, "DISTRUN_HOME": str(home)}
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job_id, "-f", "--rank", "5"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    refused = distrun("logs", job_id, "--recover", home=home)
    out, _ = follower.communicate(timeout=120)

    assert refused.returncode == 2 and f"--recover: job {job_id} is still" in refused.stderr, refused.stderr
    assert follower.returncode == 1, "logs -f exits with the job's exit code"
    assert "[node2 r5] the last words" in out and "[node2 r5 err] RuntimeError: deliberate failure" in out
    assert "job " + job_id + " FAILED" not in out, "a filtered follow does not show the summary"
    assert (home / "jobs" / job_id / "lines.idx").exists(), "a refused recover touches nothing"


STALL_LINES = 60_000  # per rank: 360,000 lines, the flood


def test_a_pipe_nobody_reads_for_a_while_gets_every_line_in_order_in_the_end(cluster3, inv, ids, tmp_path) -> None:
    """The job is not held up by the stalled pipe (its files fill as fast as ever), and once the
    pipe is read it gets every line, each rank's in order, before the summary."""
    job = write_job(tmp_path, "stall", ["--lines", str(STALL_LINES)])
    home = tmp_path / "home"
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inv), "--job-id",
                             ids["stall"]], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    began = time.monotonic()
    try:
        last = f"rank 5 line {STALL_LINES - 1}\n".encode()
        rank5 = home / "jobs" / ids["stall"] / "ranks" / "5.out"
        assert wait_for(lambda: rank5.exists() and last in rank5.read_bytes()[-200:], 120, every=0.5)
        print(f"MEASURED every line in the job's files, stdout unread: {time.monotonic() - began:.1f} s")
        time.sleep(10)  # longer than the screen's drain at the end: the pipe is still behind
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    text = out.decode()
    assert proc.returncode == 0, text[-3000:]
    body, summary = text.split(f"job {ids['stall']} succeeded", 1)
    for rank in range(6):
        numbers = [int(m) for m in re.findall(rf"^\[node\d r{rank}\] rank {rank} line (\d+)$", body, re.M)]
        assert numbers == list(range(STALL_LINES)), f"rank {rank}: {len(numbers)} lines"
    assert "not shown" not in summary and "skipped" not in text
