"""Fault-tolerant jobs on real hosts (namespace hosts, real sshd, torchrun and torchft, gloo on CPU):
one replica group per host, the lighthouse a job of its own on the spare (node3)."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.test_launch_cluster import job_procs, output, start
from tests.faults.invariants import CUT_HOST_BOUND
from tests.helpers import REPO, wait_for

pytest.importorskip("torchft")

WORKER = REPO / "jobs" / "train_ft.py"
STEP = re.compile(r"^\[g(\d+)\] \[(node\d) r0\] ft step (\d+) group \d+ participants (\d+) t ([\d.]+)$", re.M)
MAX_PAUSE = 20.0  # the bound on a surviving group's pause
HEARTBEAT = 4


def ft_job(tmp_path: Path, port: int, args: list[str], extra: str = "") -> Path:
    path = tmp_path / "ft.yaml"
    path.write_text(f"name: ft\nscript: {WORKER}\nargs: {json.dumps(args)}\nnproc_per_node: 1\nnnodes: 3\n"
                    f"env: {{OMP_NUM_THREADS: '1', RUST_LOG: warn}}\nheartbeat_timeout: {HEARTBEAT}\nstop_grace: 3\n"
                    f"restarts: {{max: 1, backoff: 1}}\n"
                    f"fault_tolerance: {{min_replicas: 1, lighthouse_port: {port}}}\n{extra}")
    return path


def start_ft(make_cluster, tmp_path: Path, steps: int) -> tuple[Cluster, str, Path, int, subprocess.Popen]:
    """A 4-host cluster and a launch of `steps` steps on it, 3 groups of one host and the spare node3:
    the cluster, the job id, DISTRUN_HOME, the lighthouse's port and the launch."""
    cluster = make_cluster(4)
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    job_id, home = f"ft-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    port = 29000 + uuid.uuid4().int % 900
    job = ft_job(tmp_path, port, ["--steps", str(steps), "--step-time", "0.3"])
    return cluster, job_id, home, port, start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1,node2,node3")


def steps(out: str) -> dict[int, list[tuple[str, int, float]]]:
    """Each group's (node, step, time) lines, in order."""
    found: dict[int, list[tuple[str, int, float]]] = {}
    for group, node, step, _, when in STEP.findall(out):
        found.setdefault(int(group), []).append((node, int(step), float(when)))
    return found


def group_procs(cluster, job_id: str, groups: int = 3) -> dict[int, list]:
    """Every host's processes of any of the job's groups, and of its lighthouse."""
    seen: dict[int, list] = {i: [] for i in range(cluster.n)}
    for child in [*(f"-g{index}" for index in range(groups)), "-lh"]:
        for host, procs in job_procs(cluster, job_id + child).items():
            seen[host] += procs
    return seen


def listening_at(log: str, node: str) -> float:
    """When the lighthouse on `node` said it listens, as lighthouse.log has it (its clock: this machine's)."""
    stamp = re.search(rf"^\[lighthouse\] \[{node} r0 err\] (\S+) \[INFO\] \S+ - Lighthouse listening", log, re.M)
    assert stamp, log[-3000:]
    return datetime.fromisoformat(stamp[1]).replace(tzinfo=timezone.utc).timestamp()


def test_a_cut_host_costs_its_group_only_which_comes_back_on_the_spare_healed_from_a_peer(make_cluster, tmp_path):
    cluster, job_id, home, port, proc = start_ft(make_cluster, tmp_path, 70)
    cut_at = cluster.cut_during(proc, 1, 300, ready=lambda: "ft step 12 group 1 " in output(home, job_id),
                                says=lambda: output(home, job_id)[-3000:])
    out = output(home, job_id)
    assert proc.returncode == 0, out[-5000:]
    found = steps(out)
    for survivor in (0, 2):
        numbers = [step for _, step, _ in found[survivor]]
        assert numbers == list(range(numbers[0], 71)), f"group {survivor} never repeated a step: {numbers}"
        pause = max(b[2] - a[2] for a, b in itertools.pairwise(found[survivor]))
        assert pause < MAX_PAUSE, f"group {survivor} paused {pause:.1f} s"
        print(f"MEASURED group {survivor} longest pause: {pause:.1f} s")
    lost = found[1]
    before = [step for node, step, when in lost if node == "node1" and when < cut_at]
    after = [(step, when) for node, step, when in lost if node == "node3"]
    assert before and after, lost
    assert after[0][0] > before[-1] + 5, f"group 1 healed from a peer: first step on node3 {after[0][0]}"
    print(f"MEASURED group 1 back in the quorum {after[0][1] - cut_at:.1f} s after the cut, at step {after[0][0]}")
    assert "restarting: attempt 2 on node3: node3 in place of node1" in out
    assert "succeeded: 3 of 3 replica group(s) finished" in out
    assert wait_for(lambda: not any(group_procs(cluster, job_id).values()), CUT_HOST_BOUND), \
        group_procs(cluster, job_id)
    assert not [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, f"0.0.0.0:{port}")]


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def test_a_cut_lighthouse_host_moves_it_and_the_groups_step_on_without_a_relaunch(make_cluster, tmp_path):
    cluster, job_id, home, _port, proc = start_ft(make_cluster, tmp_path, 80)
    try:
        assert wait_for(lambda: "ft step 12 group 2 " in output(home, job_id), 180), output(home, job_id)[-3000:]
        cluster.cut(3)  # the spare, where the lighthouse runs
        cut_at = time.time()
        proc.wait(timeout=300)
        out = output(home, job_id)
        assert proc.returncode == 0, out[-5000:]
        assert "[lighthouse] restarting: attempt 2 on node0: node0 in place of node3" in out
        assert f"lighthouse ({job_id}-lh): started 2 time(s), last on node0" in out
        # A group may crash on torchft 0.2.0's restart of quorum ids (docs/fault-tolerance.md: a known hazard) and be
        # relaunched; the job must still succeed. Only a group that was not relaunched is held to
        # stepping on without a repeated step.
        relaunched = {int(g) for g in re.findall(r"^\[g(\d)\] restarting", out, re.M)}
        print(f"MEASURED groups relaunched while the lighthouse moved: {sorted(relaunched) or 'none'}")
        for group, lines in steps(out).items():
            numbers = [step for _, step, _ in lines]
            if group not in relaunched:  # torchft's manager may skip a step whose quorum failed, never repeat one
                assert numbers == sorted(set(numbers)) and numbers[-1] == 80, \
                    f"group {group} stepped on, no repeat: {numbers}"
            pause = max(b[2] - a[2] for a, b in itertools.pairwise(lines))
            print(f"MEASURED group {group} longest pause with its lighthouse's host cut: {pause:.1f} s")
        log = (home / "jobs" / job_id / "lighthouse.log").read_text(errors="replace")
        print(f"MEASURED lighthouse listening on node0 {listening_at(log, 'node0') - cut_at:.1f} s after the cut")
    finally:
        cluster.restore(3)
        if proc.poll() is None:
            proc.kill()
    assert wait_for(lambda: not any(group_procs(cluster, job_id).values()), CUT_HOST_BOUND), \
        group_procs(cluster, job_id)


def test_a_killed_controller_has_the_hosts_end_every_group_and_the_lighthouse(make_cluster, tmp_path):
    cluster, job_id, home, _port, proc = start_ft(make_cluster, tmp_path, 400)
    try:
        assert wait_for(lambda: "ft step 5 group 2 " in output(home, job_id), 180), output(home, job_id)[-3000:]
        assert job_procs(cluster, f"{job_id}-lh")[3], "the lighthouse runs on the spare"
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        assert wait_for(lambda: not any(group_procs(cluster, job_id).values()), HEARTBEAT + 10), \
            group_procs(cluster, job_id)
        print(f"MEASURED every group and the lighthouse ended {time.time() - killed_at:.1f} s after the SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
