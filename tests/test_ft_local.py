"""Fault-tolerant jobs end to end on this machine: replica groups of real torchrun and torchft
(gloo on CPU) on hosts that are all this machine (the local transport), a real lighthouse."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO, distrun, on_terminal, wait_for

pytest.importorskip("torchft")

WORKER = REPO / "jobs" / "train_ft.py"
STEP = re.compile(r"^\[g(\d+)\] \[\w+ r0\] ft step (\d+) group \d+ participants (\d+) t ([\d.]+)$", re.M)
MAX_PAUSE = 20.0  # the bound on a surviving group's pause


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_job(tmp_path: Path, args: list[str], extra: str = "", nodes: tuple[str, ...] = ("a", "b"),
              script: Path = WORKER) -> Path:
    inv = tmp_path / "inv.yaml"
    python = sys.executable
    inv.write_text("nodes:\n" + "".join(f"  - {{name: {name}, host: localhost, transport: local, python: {python}}}\n"
                                         for name in nodes))
    path = tmp_path / "job.yaml"
    path.write_text(f"name: ft\nscript: {script}\nargs: {json.dumps(args)}\nnproc_per_node: 1\nstop_grace: 2\n"
                    f"env: {{OMP_NUM_THREADS: '1', RUST_LOG: warn}}\n"
                    f"fault_tolerance: {{min_replicas: 1, lighthouse_port: {free_port()}}}\n{extra}")
    return path


def kill_group(script: Path, group: int) -> None:
    """SIGKILL every rank of replica group `group` running `script` (at least one)."""
    ranks = [p for p in psutil.process_iter(["cmdline", "environ"]) if str(script) in " ".join(
        p.info["cmdline"] or []) and (p.info["environ"] or {}).get("REPLICA_GROUP_ID") == str(group)]
    assert ranks
    for rank in ranks:
        rank.send_signal(signal.SIGKILL)


def launch(tmp_path: Path, job: Path, home: Path, when: str | Callable[[str], bool] | None = None,
           act: Callable[[], None] | None = None, *flags: str) -> tuple[int, str]:
    """`distrun launch JOB -i inv.yaml`; once its output shows `when` (or `when(output)` holds), `act()`;
    its exit code and output."""
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1", "XDG_CONFIG_HOME": str(home / "nc")}
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job), "-i",
                                 str(tmp_path / "inv.yaml"), "--no-live", *flags], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        if when is not None:
            seen = when if callable(when) else (lambda text: when in text)
            assert wait_for(lambda: seen(out.read_text()), 120), out.read_text()[-3000:]
            assert act is not None
            act()
        return proc.wait(timeout=240), out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def steps(out: str) -> dict[int, list[tuple[int, int, float]]]:
    """Each group's (step, participants, time) lines, in order."""
    found: dict[int, list[tuple[int, int, float]]] = {}
    for group, step, participants, when in STEP.findall(out):
        found.setdefault(int(group), []).append((int(step), int(participants), float(when)))
    return found


def longest_pause(lines: list[tuple[int, int, float]]) -> float:
    return max(b[2] - a[2] for a, b in itertools.pairwise(lines))


def lighthouses(port: int) -> list[psutil.Process]:
    """The lighthouse's processes: the lighthouse and the torchrun that runs it."""
    return [p for p in psutil.process_iter(["cmdline"]) if f"0.0.0.0:{port}" in " ".join(p.info["cmdline"] or [])]


def the_lighthouse(port: int) -> psutil.Process:
    (light,) = [p for p in lighthouses(port) if "distrun_torchrun.py" not in " ".join(p.info["cmdline"] or [])]
    return light


def port_of(job: Path) -> int:
    return int(re.search(r"lighthouse_port: (\d+)", job.read_text()).group(1))


def test_two_replica_groups_train_beside_a_lighthouse_that_ends_with_the_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "8", "--step-time", "0.1"])
    code, out = launch(tmp_path, job, home)
    assert code == 0, out[-4000:]
    found = steps(out)
    assert sorted(found) == [0, 1]
    assert all(lines[-1][0] == 8 for lines in found.values()), found
    assert any(p == 2 for lines in found.values() for _, p, _ in lines), "both groups were in one quorum"
    assert "succeeded: 2 of 2 replica group(s) finished" in out
    job_id = re.search(r"Submitted job (\S+)", out).group(1)
    lines = (home / "jobs" / job_id / "lighthouse.log").read_text().splitlines()
    assert lines and all(line.startswith("[lighthouse] ") for line in lines)
    assert not lighthouses(port_of(job)), "the lighthouse ended with the job"
    assert f"lighthouse ({job_id}-lh): started 1 time(s), last on a" in out, "a job of its own, on a host"
    # The latest quorum may hold only the group still stepping once the other took its last step.
    assert re.search(r"last quorum: [12] group\(s\) \((group0, group1|group0|group1)\) at step ", out), out[-2000:]
    state = json.loads((home / "jobs" / job_id / "groups.json").read_text())
    assert [(g["index"], g["hosts"], g["state"]) for g in state["groups"]] == [(0, ["a"], "succeeded"),
                                                                                (1, ["b"], "succeeded")]
    assert set(state["quorum"]["participants"]) <= {"group0", "group1"} and state["quorum"]["participants"]


def test_a_lighthouse_killed_mid_run_is_started_again_and_the_job_succeeds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "40", "--step-time", "0.1"], "restarts: {max: 2}\n")
    port = port_of(job)

    def kill_lighthouse() -> None:
        the_lighthouse(port).send_signal(signal.SIGKILL)

    code, out = launch(tmp_path, job, home, when="ft step 10 ", act=kill_lighthouse)
    assert code == 0, out[-4000:]
    # SIGKILL points at its host (as a rank's crash does): the lighthouse moves to the next host.
    assert "[lighthouse] restarting: attempt 2 on b: b in place of a" in out
    assert re.search(r"lighthouse \(\S+-lh\): started 2 time\(s\), last on b", out), out[-3000:]
    relaunched = "[g0]   attempt 2 on a" in out or "[g1]   attempt 2 on b" in out
    for group, lines in steps(out).items():
        numbers = [step for step, _, _ in lines]
        assert numbers[-1] == 40, (group, numbers)
        # On a loaded machine a group's quorum retries can run out before the new lighthouse
        # listens: the group is then relaunched (restarts.max), and may repeat steps. Otherwise none.
        if not relaunched:
            assert numbers == sorted(set(numbers)), (group, numbers)
            assert longest_pause(lines) < MAX_PAUSE, (group, longest_pause(lines))
        print(f"MEASURED group {group} longest pause with the lighthouse killed: {longest_pause(lines):.1f} s")
    assert not lighthouses(port)


def test_a_group_whose_rank_is_killed_comes_back_on_the_spare_healed_from_its_peer_as_ps_shows(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    # 150 steps: group 0 must still be stepping when group 1 is back on the spare (on a loaded
    # 2-core box that took 11 s; with 60 steps group 0 had finished and group 1 started alone).
    job = write_job(tmp_path, ["--steps", "150", "--step-time", "0.1"], "nnodes: 2\nrestarts: {max: 1}\n",
                    nodes=("a", "b", "c"))

    code, out = launch(tmp_path, job, home, when="ft step 15 group 1", act=lambda: kill_group(WORKER, 1))
    assert code == 0, out[-4000:]
    found = steps(out)
    survivor = [step for step, _, _ in found[0]]
    assert survivor == list(range(survivor[0], 151)), "group 0 never repeated nor skipped a step"
    assert longest_pause(found[0]) < MAX_PAUSE
    # Group 1 on the spare starts from no state: its first step is past its last on b only when it
    # healed from group 0 (which may have waited for it in the quorum, so the steps need not leave a gap).
    on = {host: [int(step) for h, step in re.findall(r"^\[g1\] \[(\w+) r0\] ft step (\d+) ", out, re.M) if h == host]
          for host in ("b", "c")}
    # (a group that joins late heals past the first steps: b's need not start at 1)
    assert on["b"] == list(range(on["b"][0], on["b"][-1] + 1)) and on["b"][-1] >= 15 and on["c"], out[-3000:]
    assert on["c"] == list(range(on["c"][0], 151)) and on["c"][0] > on["b"][-1], f"group 1 healed from its peer: {on}"
    assert "restarting: attempt 2 on c: c in place of b" in out
    assert "    attempt 2 on c, " in out, "the summary tells the group's story"
    assert re.search(r"^  group 1 \(\S+-g1\) on c: succeeded\n    (rank 0 on )?b killed by SIGKILL[^,]* at step \d+, "
                     r"relaunched on c, healed from group 0 at step \d+$", out, re.M), out[-3000:]
    job_id = re.search(r"Submitted job (\S+)", out).group(1)
    (listed,) = [j for j in json.loads(distrun("ps", "--json", home=home).stdout) if j["id"] == job_id]
    assert [(g["index"], g["job"], g["hosts"], g["state"], g["relaunches"]) for g in listed["groups"]] == [
        (0, f"{job_id}-g0", ["a"], "succeeded", 0), (1, f"{job_id}-g1", ["c"], "succeeded", 1)]
    # The latest quorum may hold only the group still stepping once the other took its last step.
    assert set(listed["quorum"]["participants"]) <= {"group0", "group1"} and listed["quorum"]["step"] >= 149


def test_fewer_groups_than_min_replicas_fail_the_job_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "200", "--step-time", "0.1", "--fail-group", "1", "--fail-at", "5"])
    job.write_text(job.read_text().replace("min_replicas: 1", "min_replicas: 2"))
    code, out = launch(tmp_path, job, home)
    assert code == 1, out[-4000:]
    assert re.search(r"FAILED: replica group 1 failed \(job \S+-g1\); 1 group\(s\) left, fewer than min_replicas 2",
                     out), out[-3000:]
    assert "stopping replica group 0" in out
    assert not lighthouses(port_of(job))
    job_id = re.search(r"Submitted job (\S+)", out).group(1)
    (listed,) = [j for j in json.loads(distrun("ps", "--json", "--all", home=home).stdout) if j["id"] == job_id]
    root = listed["failures"][0]
    assert (root["host"], root["rank"], root["kind"], root["exit_code"]) == ("b", 0, "exit", 3), listed["failures"]


def test_a_lighthouse_that_exits_before_it_listens_fails_the_job_at_once_naming_why(tmp_path: Path) -> None:
    # A socket bound to the port and not listening: the connect check finds the port free, and the
    # real lighthouse then exits with "RuntimeError: Address already in use". Every restart would too.
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "50", "--step-time", "0.1"])
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", port_of(job)))
        began = time.monotonic()
        code, out = launch(tmp_path, job, home)
        took = time.monotonic() - began
    assert code == 3, out[-3000:]
    assert re.search(r"FAILED: the torchft lighthouse did not start: it exited before it listened: a \(localhost\) "
                     r"rank 0: exit code 1, last line: RuntimeError: Address already in use", out), out[-3000:]
    assert took < 100, f"{took:.1f} s: the lighthouse's restarts were waited out (READY_WAIT: 120 s)"
    assert "replica group 0 on" not in out, "no group starts without a lighthouse"
    assert not lighthouses(port_of(job))


def test_a_killed_controller_leaves_no_group_and_no_lighthouse_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "400", "--step-time", "0.1"], "heartbeat_timeout: 4\n")
    port = port_of(job)
    parents: list[int] = []

    def kill_controller() -> None:
        (parent,) = [p for p in psutil.process_iter(["cmdline"]) if str(job) in " ".join(p.info["cmdline"] or [])
                     and "--job-id" not in (p.info["cmdline"] or [])]
        parents.append(parent.pid)
        parent.send_signal(signal.SIGKILL)

    code, out = launch(tmp_path, job, home, when=" group 1 participants 2 ", act=kill_controller)
    assert code == -signal.SIGKILL, out[-3000:]

    def leftovers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if str(WORKER) in " ".join(p.info["cmdline"] or [])
                or f"0.0.0.0:{port}" in " ".join(p.info["cmdline"] or [])]

    assert wait_for(lambda: not leftovers(), 30), [p.info["cmdline"] for p in leftovers()]


def test_distrun_stop_of_the_job_stops_every_group_and_the_lighthouse(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "400", "--step-time", "0.1"])
    port = port_of(job)
    env = {**os.environ, "DISTRUN_HOME": str(home), "XDG_CONFIG_HOME": str(home / "nc")}

    def stop() -> None:
        job_id = re.search(r"Submitted job (\S+) ", (tmp_path / "out.txt").read_text()).group(1)
        done = subprocess.run([sys.executable, "-m", "orchestrator", "stop", job_id], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    code, out = launch(tmp_path, job, home, when=" group 1 participants 2 ", act=stop)
    assert code == 143, out[-3000:]
    assert "stopping replica group 0" in out and "stopping replica group 1" in out
    assert "stopped (SIGTERM); every group and the lighthouse ended" in out
    assert "replica group 0 stopped by distrun" in out and "replica group 1 stopped by distrun" in out
    assert "failed (exit" not in out, "a group distrun stopped did not fail"
    assert not lighthouses(port)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(WORKER) in " ".join(p.info["cmdline"] or [])]


def test_bundled_resnet_script_trains_as_ft_ddp_replica_groups_in_one_quorum(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--strategy", "ft-ddp", "--model", "tiny", "--image-size", "16", "--batch-size", "4",
                               "--num-classes", "10", "--steps", "6", "--log-every", "2"],
                    script=REPO / "jobs" / "train_resnet50.py")
    job.write_text(job.read_text().replace("min_replicas: 1", "min_replicas: 2"))  # every step has both groups
    code, out = launch(tmp_path, job, home, None, None, "--metrics-lines")
    assert code == 0, out[-4000:]
    logged = re.findall(r"^\[g(\d)\] \[\w+ r0\] train_resnet50: ft step (\d+) group \1 participants (\d)$", out, re.M)
    assert {(group, step) for group, step, _ in logged} >= {("0", "6"), ("1", "6")}, out[-4000:]
    assert {participants for _, _, participants in logged} == {"2"}, "both groups averaged every step"
    finals = [json.loads(line) for line in re.findall(r"DISTRUN_METRICS (\{.*\"final\": true.*\})$", out, re.M)]
    assert [(f["step"], f["strategy"]) for f in finals] == [(6, "ft-ddp"), (6, "ft-ddp")], out[-4000:]
    assert "succeeded: 2 of 2 replica group(s) finished" in out


def test_bundled_resnet_script_group_killed_mid_run_is_relaunched_and_heals_from_its_peer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = REPO / "jobs" / "train_resnet50.py"
    # --slow-s paces every group's rank 0 (0.1 s a step): group 0 is still stepping when group 1 is back.
    # The kill waits for a step both groups took (a group that started late runs alone at first).
    job = write_job(tmp_path, ["--strategy", "ft-ddp", "--model", "tiny", "--image-size", "16", "--batch-size", "4",
                               "--num-classes", "10", "--steps", "250", "--log-every", "1", "--slow-rank", "0",
                               "--slow-s", "0.1"], "nnodes: 2\nrestarts: {max: 1}\n", nodes=("a", "b", "c"),
                    script=script)

    both = re.compile(r"train_resnet50: ft step (\d+) group 0 participants 2$", re.M)
    code, out = launch(tmp_path, job, home, when=lambda text: any(int(s) >= 30 for s in both.findall(text)),
                       act=lambda: kill_group(script, 1))
    assert code == 0, out[-4000:]
    logged = [(group, host, int(step)) for group, host, step in re.findall(
        r"^\[g(\d)\] \[(\w+) r0\] train_resnet50: ft step (\d+) group \1 participants \d$", out, re.M)]
    survivor = [step for group, _, step in logged if group == "0"]
    assert survivor == list(range(survivor[0], 251)), "group 0 never repeated nor skipped a step"
    before = [step for group, host, step in logged if group == "1" and host == "b"]
    after = [step for group, host, step in logged if group == "1" and host == "c"]
    assert before and after and after[0] > before[-1] >= 30, f"group 1 healed from its peer: {before} then {after}"
    assert "restarting: attempt 2 on c: c in place of b" in out
    assert "succeeded: 2 of 2 replica group(s) finished" in out


def test_logs_group_shows_one_groups_lines_and_ps_lists_the_groups_under_their_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    code, out = launch(tmp_path, write_job(tmp_path, ["--steps", "4", "--step-time", "0.1"]), home)
    assert code == 0, out[-4000:]
    job_id = re.search(r"Submitted job (\S+)", out).group(1)

    group1 = distrun("logs", job_id, "--group", "1", "--grep", "ft step", "--bare", home=home)
    assert group1.returncode == 0, group1.stderr
    shown = [line.split(" participants")[0] for line in group1.stdout.splitlines()]
    # Group 1 may join late and heal past the first steps (seen under load: its first line was step 3).
    first = int(shown[0].split()[2]) if shown else 0
    assert shown == [f"ft step {step} group 1" for step in range(first, 5)] and first >= 1, group1.stdout
    via_last = distrun("logs", "last", "--group", "0", "--grep", "ft step 4 ", "--bare", home=home)
    assert via_last.stdout.startswith("ft step 4 group 0 "), "`last` is a group's job: its parent's group 0"
    beyond = distrun("logs", job_id, "--group", "2", home=home)
    assert (beyond.returncode, beyond.stderr) == (2, f"distrun: error: --group 2: job {job_id} has replica "
                                                     "group(s) 0-1\n")

    table = distrun("ps", home=home).stdout.splitlines()
    under = table[[line.split()[0] for line in table].index(job_id) + 1:][:3]
    assert under[0] == f"  group 0  succeeded  relaunches=0  a  ({job_id}-g0)"
    assert under[1] == f"  group 1  succeeded  relaunches=0  b  ({job_id}-g1)"
    # The latest quorum: both groups, or the one still stepping after the other finished its last step.
    assert re.fullmatch(r"  quorum: (2 group\(s\) \(group0, group1\)|1 group\(s\) \(group[01]\)) at step \d+",
                        under[2]), under


def test_on_a_terminal_the_parent_draws_a_row_per_group_and_the_lighthouse_and_quorum_under_them(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = write_job(tmp_path, ["--steps", "6", "--step-time", "0.1"])
    seen = on_terminal(["launch", str(job), "-i", str(tmp_path / "inv.yaml")], home,
                       {"OMP_NUM_THREADS": "1", "XDG_CONFIG_HOME": str(home / "nc")}, size=(50, 160))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen).replace("\r", "")
    assert re.search(r"^ *group +state +hosts +relaunches +step +quorum *$", text, re.M), text[-3000:]
    last = text[text.rindex("relaunches"):]  # the last frame, left on screen at the end
    assert re.search(r"^ *0 +done +a +0 +\d+ +(in|out) *$", last, re.M), last
    assert re.search(r"^ *1 +done +b +0 +\d+ +(in|out) *$", last, re.M), last
    assert re.search(r"^lighthouse on \S+ · started 1 time\(s\) *$", last, re.M), last
    assert re.search(r"^quorum: [12] group\(s\) \(group[01](, group1)?\) at step \d+ *$", last, re.M), last
    assert "succeeded: 2 of 2 replica group(s) finished" in text
