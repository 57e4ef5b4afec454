"""`fault_tolerance:` in a job file: its checks, the replica groups it makes, and the dry run."""

from __future__ import annotations

import json
import socket
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.remote import ftforward
from orchestrator.remote.ftforward import UPSTREAMS, forward_lighthouse
from orchestrator.run.ft.groups import ReplicaGroup, group_job, split
from orchestrator.run.ft.lighthouse import SYSTEM_PATH, lighthouse_job
from orchestrator.run.ft.preflight import check_torchft
from orchestrator.run.ft.timeline import quorum_of
from orchestrator.spec.job import job_from_text
from orchestrator.spec.model import FaultTolerance, NodeSpec, TransportKind
from orchestrator.spec.overrides import job_to_yaml
from tests.helpers import REPO, distrun

WORKER = REPO / "jobs" / "train_ft.py"


def ft_job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: ft\nscript: {WORKER}\nnproc_per_node: 1\n{body}")
    return path


def local_inventory(tmp_path: Path, names: list[str]) -> Path:
    """Hosts that are all this machine, through the local transport (no SSH)."""
    path = tmp_path / "inv.yaml"
    python = sys.executable
    path.write_text("nodes:\n" + "".join(f"  - {{name: {n}, host: localhost, transport: local, python: {python}}}\n"
                                         for n in names))
    return path


@pytest.mark.parametrize(("body", "message"), [
    ("nnodes: 3\nfault_tolerance: {hosts_per_group: 2}\n",
     "fault_tolerance.hosts_per_group: 2 does not divide nnodes 3"),
    ("nnodes: 2\nfault_tolerance: {min_replicas: 3}\n",
     "fault_tolerance.min_replicas: 3 is above the 2 replica group(s)"),
    ("nnodes: '1:2'\nfault_tolerance: {}\n", "fault_tolerance: does not combine with nnodes: MIN:MAX"),
    ("fault_tolerance: {min_replicas: 0}\n", "fault_tolerance.min_replicas: must be an integer >= 1"),
    ("fault_tolerance: {replicas: 2}\n", "replicas"),
])
def test_a_bad_fault_tolerance_is_one_line_with_exit_2(tmp_path: Path, body: str, message: str) -> None:
    result = distrun("launch", str(ft_job(tmp_path, body)), "--dry-run", home=tmp_path / "home")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_selection_that_makes_no_whole_groups_is_refused_at_launch(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ["a", "b", "c"])
    result = distrun("launch", str(ft_job(tmp_path, "fault_tolerance: {hosts_per_group: 2}\n")), "-i", str(inv),
                     "--dry-run", home=tmp_path / "home")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("distrun: error: fault_tolerance: hosts_per_group 2 does not divide the 3 "
                                     "selected host(s) (select a multiple of 2 with --nodes/--nnodes)")


def test_hosts_split_into_groups_in_order_each_free_to_take_every_spare() -> None:
    groups = split(["n0", "n1", "n2", "n3"], ["s0"], FaultTolerance(min_replicas=2, hosts_per_group=2))
    assert groups == [ReplicaGroup(0, ("n0", "n1"), ("s0",)), ReplicaGroup(1, ("n2", "n3"), ("s0",))]
    with pytest.raises(UsageError, match="min_replicas 3 is above the 2 replica group"):
        split(["n0", "n1", "n2", "n3"], [], FaultTolerance(min_replicas=3, hosts_per_group=2))


def test_a_group_job_is_a_plain_job_of_its_hosts_with_torchfts_variables(tmp_path: Path) -> None:
    job = job_from_text(f"name: ft\nscript: {WORKER}\nnnodes: 4\nenv: {{A: '1', TORCHFT_QUORUM_RETRIES: '3'}}\n"
                        "rendezvous: {port: 29400}\nfault_tolerance: {hosts_per_group: 2}\n", "job.yaml")
    one = group_job(job, ReplicaGroup(1, ("n2", "n3")), 2, "10.0.0.9:29510,10.0.0.1:29510")
    assert (one.name, one.nnodes, one.fault_tolerance, one.rendezvous.port) == ("ft-g1", 2, None, 29401)
    assert one.env == {"A": "1", "TORCHFT_QUORUM_RETRIES": "3", "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "2",
                       "DISTRUN_LIGHTHOUSE_UPSTREAMS": "10.0.0.9:29510,10.0.0.1:29510"}
    assert job_from_text(job_to_yaml(one), "again.yaml").env == one.env


def test_dry_run_shows_the_lighthouse_on_the_spare_and_every_groups_torchrun_and_env(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ["a", "b", "c"])
    home = tmp_path / "home"
    body = "nnodes: 2\nfault_tolerance: {min_replicas: 1, lighthouse_port: 29577}\n"
    result = distrun("launch", str(ft_job(tmp_path, body)), "-i", str(inv), "--dry-run", "--job-id", "ft-x", home=home)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert ("2 replica group(s), min_replicas 1; lighthouse on c (a spare, not training, then a, b if it is lost), "
            f"port 29577, job ft-x-lh: {Path(sys.executable).parent / 'torchft_lighthouse'} --min_replicas 1 "
            "--bind 0.0.0.0:29577") in out
    for index, node in enumerate(["a", "b"]):
        block = out.split(f"== replica group {index}: {node} ==")[1].split("== replica group")[0]
        assert f"REPLICA_GROUP_ID={index}" in block and "NUM_REPLICA_GROUPS=2" in block
        assert "DISTRUN_LIGHTHOUSE_UPSTREAMS=localhost:29577" in block
        assert "--nnodes 1 --nproc-per-node 1" in block and str(WORKER) in block
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir()), "a dry run writes no job"


def test_the_lighthouse_is_found_where_the_preflight_saw_pip_put_it_before_beside_the_hosts_python(
        tmp_path: Path) -> None:
    # The fault matrix's hosts run a wrapper python (python-gated): torchft_lighthouse is not beside
    # it, and the lighthouse failed with "env: 'torchft_lighthouse': No such file or directory".
    job = job_from_text(f"name: ft\nscript: {WORKER}\nnnodes: 2\nfault_tolerance: {{min_replicas: 1}}\n", "j.yaml")
    wrapped = [NodeSpec(name="n2", host="h2", python="/tmp/gate/python-gated")]
    found = lighthouse_job(job, wrapped, tmp_path / "lh.yaml", "/opt/venv/bin")
    assert found.env["PATH"] == f"/opt/venv/bin:/tmp/gate:{SYSTEM_PATH}"
    assert "PATH" not in lighthouse_job(job, [NodeSpec(name="n2", host="h2")], tmp_path / "lh.yaml").env


def test_the_lighthouse_runs_under_torchrun_without_the_worker_entry_which_env_could_not_start(tmp_path: Path) -> None:
    """torchrun starts the lighthouse as `env -u -m torchft_lighthouse ARGS` (PYTHON_EXEC=env): the
    lighthouse's job file turns the Flight Recorder's worker entry off, and its groups keep it."""
    job = job_from_text(f"name: ft\nscript: {WORKER}\nnnodes: 2\nfault_tolerance: {{min_replicas: 1}}\n", "j.yaml")
    light = lighthouse_job(job, [NodeSpec(name="n2", host="h2")], tmp_path / "lh.yaml")
    assert job.flight_recorder and not light.flight_recorder
    assert "flight_recorder: false" in job_to_yaml(light).splitlines()
    assert not job_from_text(job_to_yaml(light), str(tmp_path / "lh.yaml")).flight_recorder


def test_the_preflight_finds_the_lighthouse_of_a_pip_target_install_in_its_bin(tmp_path: Path) -> None:
    # `pip install --target DIR` puts torchft in DIR and torchft_lighthouse in DIR/bin, beside no
    # python: on the lent GPU machine the lighthouse was looked for in the python's scripts
    # directory and failed with "env: 'torchft_lighthouse': No such file or directory".
    torchft = pytest.importorskip("torchft")
    target = tmp_path / "site"
    (target / "bin").mkdir(parents=True)
    (target / "torchft").symlink_to(Path(torchft.__file__).parent)
    (target / "bin" / "torchft_lighthouse").write_text("#!/bin/sh\n")
    (target / "bin" / "torchft_lighthouse").chmod(0o755)
    python = tmp_path / "python-target"  # the base python, torchft from the target, torch from the venv
    path = f"{target}:{sysconfig.get_path('purelib')}"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {sys._base_executable} \"$@\"\n")
    python.chmod(0o755)
    scripts = check_torchft([NodeSpec(name="a", host="localhost", transport=TransportKind.LOCAL, python=str(python))])
    # Then the base python's own directory: a python named `python3` is found under that PATH as it was.
    assert scripts == {"a": f"{target / 'bin'}:{Path(sys._base_executable).parent}"}


def test_the_lighthouses_quorum_line_gives_its_participants_and_highest_step() -> None:
    line = (b'2026-11-26T01:39:11.265 [INFO] [torchft::lighthouse] - Quorum! Quorum { quorum_id: 4, participants: '
            b'[QuorumMember { replica_id: "group0:93e6eb06", address: "http://node0:44839", store_address: '
            b'"10.0.0.10:29594", step: 13, world_size: 1, shrink_only: false, commit_failures: 0, data: "" }, '
            b'QuorumMember { replica_id: "group2:5918146b", address: "http://node2:36149", store_address: '
            b'"10.0.0.12:29854", step: 14, world_size: 1, shrink_only: false, commit_failures: 0, data: "" }], '
            b'created: Some(Timestamp { seconds: 1795657116, nanos: 276907907 }) }\n')
    quorum = quorum_of(line)
    assert (quorum.id, quorum.participants, quorum.step) == (4, ("group0", "group2"), 14)
    assert quorum_of(b"[INFO] [torchft::lighthouse] - Quorum status: New quorum not ready\n") is None


def test_hosts_whose_python_lacks_torchft_stop_the_launch_in_one_line_naming_them(tmp_path: Path) -> None:
    lacking = tmp_path / "python-without-torchft"
    lacking.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torchft'\" >&2\nexit 1\n")
    lacking.chmod(0o755)
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n" + "".join(f"  - {{name: {name}, host: localhost, transport: local, python: {python}}}\n"
                                        for name, python in (("a", sys.executable), ("b", lacking), ("c", lacking))))
    result = distrun("launch", str(ft_job(tmp_path, "fault_tolerance: {}\n")), "-i", str(inv), home=tmp_path / "home")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "distrun: error: preflight failed; nothing was started (--skip-preflight starts anyway): torchft does not "
        "import in the python of b,c (ModuleNotFoundError: No module named 'torchft'); install it there "
        "(pip install torchft==0.2.0) or name another python in the inventory")
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


@pytest.mark.parametrize(("flags", "message"), [
    (["--backend", "slurm"], "fault_tolerance runs on an inventory's hosts (--backend ssh or local), not --backend"),
    (["--nnodes", "1:2"], "fault_tolerance does not combine with --nnodes MIN:MAX"),
])
def test_a_launch_fault_tolerance_cannot_take_is_one_line_with_exit_2(tmp_path: Path, flags: list[str],
                                                                       message: str) -> None:
    inv = local_inventory(tmp_path, ["a", "b"])
    result = distrun("launch", str(ft_job(tmp_path, "fault_tolerance: {}\n")), "-i", str(inv), *flags, "--dry-run",
                     home=tmp_path / "home")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_lighthouse_port_already_taken_fails_the_launch_before_any_group_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        inv = local_inventory(tmp_path, ["a"])
        job = ft_job(tmp_path, f"fault_tolerance: {{lighthouse_port: {port}}}\n")
        result = distrun("launch", str(job), "-i", str(inv), "--skip-preflight", home=tmp_path / "home")
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"port {port} on a is taken, so the torchft lighthouse cannot listen there" in result.stdout
    assert "replica group 0 on a" not in result.stdout
    state = json.loads(distrun("ps", "--json", home=tmp_path / "home").stdout)
    assert [(job["state"], job["exit_code"]) for job in state] == [("failed", 3)]


def test_the_bundled_resnet50_ft_job_dry_runs_as_two_one_process_groups_of_ft_ddp(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ["a", "b", "c"])
    result = distrun("launch", str(REPO / "jobs" / "resnet50-ft.yaml"), "-i", str(inv), "--dry-run",
                     home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert "2 replica group(s), min_replicas 1; lighthouse on c (a spare, not training" in result.stdout
    for index, node in enumerate(["a", "b"]):
        block = result.stdout.split(f"== replica group {index}: {node} ==")[1].split("== replica group")[0]
        assert "--nnodes 1 --nproc-per-node 1" in block and "--strategy ft-ddp" in block, block


def _serve_once(server: socket.socket, reply: bytes) -> None:
    conn, _ = server.accept()
    with conn:
        conn.sendall(reply + conn.recv(64))


def test_the_forwarder_reaches_the_lighthouse_wherever_it_listens_now() -> None:
    first, second = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in (first, second)]
    env = {UPSTREAMS: f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"}
    forward_lighthouse(env)
    local = int(env["TORCHFT_LIGHTHOUSE"].rsplit(":", 1)[1])
    assert env["TORCHFT_LIGHTHOUSE"] == f"http://127.0.0.1:{local}"

    def ask(server: socket.socket, reply: bytes) -> bytes:
        thread = threading.Thread(target=_serve_once, args=(server, reply))
        thread.start()
        with socket.create_connection(("127.0.0.1", local), timeout=5) as conn:
            conn.sendall(b"?")
            got = conn.recv(64)
        thread.join(5)
        return got

    assert ask(first, b"one") == b"one?"
    first.close()  # the lighthouse moved: its old host refuses
    assert ask(second, b"two") == b"two?"
    second.close()  # none listens: the connection is closed at once (torchft retries its quorum)
    with socket.create_connection(("127.0.0.1", local), timeout=5) as conn:
        assert conn.recv(64) == b""
    assert forward_lighthouse({"A": "1"}) is None


def test_the_forwarder_drops_a_connection_whose_lighthouse_went_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ftforward, "SILENT", 1.5)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: a host cut off
    env = {UPSTREAMS: f"127.0.0.1:{silent.getsockname()[1]}"}
    forward_lighthouse(env)
    with socket.create_connection(("127.0.0.1", int(env["TORCHFT_LIGHTHOUSE"].rsplit(":", 1)[1])), timeout=10) as conn:
        conn.sendall(b"quorum?")
        started = time.monotonic()
        assert conn.recv(64) == b""
        assert 1.5 < time.monotonic() - started < 5
    silent.close()
