"""jobs/deepspeed_zero.py on the lab's hosts (namespace hosts, real sshd, torchrun, DeepSpeed on CPU with gloo):
ZeRO-3 on 3 hosts x 2 launched from a DeepSpeed hostfile, a cut host's job resumed from DeepSpeed's last
checkpoint on the spare, and a stale torch extension build lock named by doctor and by the launch."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path

from tests.cluster.test_launch_cluster import job_procs, output, record, start, wait_for_line, write_job
from tests.faults.invariants import CUT_HOST_BOUND
from tests.helpers import REPO, distrun, wait_for

SCRIPT = REPO / "jobs" / "deepspeed_zero.py"
SMALL = ["--width", "256", "--layers", "4", "--lr", "1e-2", "--log-every", "2"]
RESUMED = re.compile(r"^\[(node\d|[\d.]+) r\d+\] train_deepspeed: rank \d+: resumed from step (\d+) ", re.M)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def losses(home: Path, job_id: str) -> list[tuple[int, float]]:
    """(step, loss) of rank 0's DISTRUN_METRICS lines, as the job's metrics.jsonl kept them."""
    rows = [json.loads(line) for line in (home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r.get("rank") == 0 and "loss" in r]


def lab_home(cluster, tmp_path: Path) -> dict[str, str]:
    """A controller environment whose ~/.ssh has the lab's host keys and ssh_config (user, key): what a
    hostfile leaves to them."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(cluster.known_hosts, home / ".ssh" / "known_hosts")
    return {"HOME": str(home), "DISTRUN_SSH_CONFIG": str(cluster.ssh_config)}


def test_zero3_on_three_hosts_from_a_deepspeed_hostfile_trains_with_the_loss_going_down(cluster3, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the lab, as the deepspeed launcher reads it\n"
                        + "".join(f"{cluster3.addr(i)} slots=2\n" for i in range(3)))
    # 1.5 s a step: the script ends with os._exit (quick_exit), which leaves no last record, so the hosts'
    # 5-s Flight Recorder rounds must land while it trains to see DeepSpeed's collectives.
    job = write_job(tmp_path, "ds3", [*SMALL, "--steps", "8", "--step-sleep", "1.5", "--print-checksum"], script=SCRIPT,
                    extra="telemetry: {interval: 1}\n")
    job.write_text(job.read_text().replace("nproc_per_node: 2", "nproc_per_node: auto"))
    home, job_id = tmp_path / "home", unique("ds3")
    done = distrun("launch", str(job), "-i", str(hostfile), "--job-id", job_id, "--no-live", home=home,
                   env=lab_home(cluster3, tmp_path), timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert "ZeRO stage 3" in done.stdout and "(6 ranks, cpu)" in done.stdout
    steps = losses(home, job_id)
    assert [s for s, _ in steps] == [2, 4, 6, 8] and steps[-1][1] < steps[0][1] / 2, steps
    logs = distrun("logs", job_id, home=home).stdout.splitlines()
    sums = [json.loads(line.split("DISTRUN_CHECKSUM ", 1)[1]) for line in logs if "DISTRUN_CHECKSUM" in line]
    assert len(sums) == 6 and len({s["weights"] for s in sums}) == 1 and {s["allreduce"] for s in sums} == {21.0}, sums
    # DeepSpeed's collectives reached the Flight Recorder distrun serves from every rank.
    rounds = [json.loads(line) for line in (home / "jobs" / job_id / "collectives.jsonl").read_text().splitlines()]
    assert max(r["ranks"].get("5", {}).get("done", 0) for r in rounds) > 0, rounds[-1:]


def test_a_cut_host_of_a_zero3_job_resumes_from_deepspeeds_last_checkpoint_on_the_spare(cluster3, tmp_path):
    inv = cluster3.write_inventory(tmp_path / "inv.yaml")
    ckpt = tmp_path / "ckpt"
    job = write_job(tmp_path, "dsspare", [*SMALL, "--steps", "16", "--checkpoint-every", "2", "--step-sleep", "0.5"],
                    script=SCRIPT, heartbeat=4,
                    extra=f"nnodes: 2\nrestarts: {{max: 2, backoff: 1}}\ncheckpoint_dir: {ckpt}\n")
    home, job_id = tmp_path / "home", unique("dsspare")
    proc = start(job, inv, home, job_id, "--no-live", "--nodes", "node0,node1,node2")
    try:
        wait_for_line(home, job_id, f"saved {ckpt}/step-4 at step 4", timeout=300)
        cluster3.cut(1)
        proc.wait(timeout=400)
    finally:
        cluster3.restore(1)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = output(home, job_id)
    assert proc.returncode == 0, out[-4000:]
    assert wait_for(lambda: not job_procs(cluster3, job_id)[1], CUT_HOST_BOUND), job_procs(cluster3, job_id)
    rec = record(home, job_id)
    assert rec["state"] == "succeeded" and rec["quarantined"] == ["node1"]
    first, second = rec["attempts"]
    assert first["hosts"] == ["node0", "node1"] and second["hosts"] == ["node0", "node2"]
    again = distrun("logs", job_id, "--attempt", "2", home=home).stdout
    points = {(node, int(step)) for node, step in RESUMED.findall(again)}
    assert {node for node, _ in points} == {"node0", "node2"} and len({s for _, s in points}) == 1, again[-3000:]
    resumed = points.pop()[1]
    assert resumed >= 4 and (ckpt / "latest").read_text().strip() == "step-16"
    final = [json.loads(line.split("DISTRUN_METRICS ", 1)[1]) for line in again.splitlines()
             if '"final": true' in line]
    assert final and final[0]["steps_run"] == 16 - resumed and final[0]["world_size"] == 4


def test_a_stale_build_lock_on_one_host_is_named_by_doctor_and_stops_the_launch(cluster3, tmp_path):
    dirs = [tmp_path / f"ext{i}" for i in range(3)]
    lock = dirs[1] / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    nodes = [{"name": f"node{i}", "host": cluster3.addr(i), "env": {"TORCH_EXTENSIONS_DIR": str(dirs[i])}}
             for i in range(3)]
    inv = cluster3.write_inventory(tmp_path / "inv.yaml", nodes=nodes)
    home = tmp_path / "home"
    doctor = distrun("doctor", "-i", str(inv), "--job", "jobs/deepspeed.yaml", home=home)
    row = next((line for line in doctor.stdout.splitlines() if "build-locks" in line), "")
    assert doctor.returncode == 1 and row.startswith("✗ build-locks") and f"node1: {lock} (" in row, doctor.stdout
    assert f"rm {lock}" in doctor.stdout
    assert re.search(r"^✓ deepspeed +node\[0-2\]: deepspeed \d", doctor.stdout, re.M), doctor.stdout
    started = time.monotonic()
    launch = distrun("launch", "jobs/deepspeed.yaml", "-i", str(inv), "--no-live", home=home, timeout=120)
    assert launch.returncode == 1 and "nothing was started" in launch.stderr, launch.stdout + launch.stderr
    assert f"node1: {lock}" in launch.stderr
    assert time.monotonic() - started < 60
