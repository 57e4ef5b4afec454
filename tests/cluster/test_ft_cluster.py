"""Fault-tolerant jobs on real hosts (namespace hosts, real sshd, torchrun and torchft, gloo on CPU):
one replica group per host, the lighthouse beside the controller."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from pathlib import Path

import pytest

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


def steps(out: str) -> dict[int, list[tuple[str, int, float]]]:
    """Each group's (node, step, time) lines, in order."""
    found: dict[int, list[tuple[str, int, float]]] = {}
    for group, node, step, _, when in STEP.findall(out):
        found.setdefault(int(group), []).append((node, int(step), float(when)))
    return found


def group_procs(cluster, job_id: str, groups: int = 3) -> dict[int, list]:
    """Every host's processes of any of the job's groups."""
    seen: dict[int, list] = {i: [] for i in range(cluster.n)}
    for index in range(groups):
        for host, procs in job_procs(cluster, f"{job_id}-g{index}").items():
            seen[host] += procs
    return seen


def test_a_cut_host_costs_its_group_only_which_comes_back_on_the_spare_healed_from_a_peer(make_cluster, tmp_path):
    cluster = make_cluster(4)
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    job_id, home = f"ft-{uuid.uuid4().hex[:6]}", tmp_path / "home"
    port = 29000 + uuid.uuid4().int % 900
    job = ft_job(tmp_path, port, ["--steps", "70", "--step-time", "0.3"])
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1,node2,node3")
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
