"""`distrun exec` end to end: the real command in a subprocess against namespace hosts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.transport.base import REACH_HINT
from tests.cluster.fixtures import MakeCluster
from tests.cluster.harness import Cluster, skip_reason
from tests.helpers import distrun

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

ECHO_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"
HOSTILE = ["; rm -rf /tmp/x", "$(touch /tmp/pwned)", "`id`", "it's \"quoted\"", "a\nb", "ünï €", "*", "", "--json"]



def run_exec(cluster: Cluster, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
             **inventory: object) -> subprocess.CompletedProcess[str]:
    path = cluster.write_inventory(tmp_path / "inventory.yaml", **inventory)
    full_env = {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "SSH_AUTH_SOCK": "", **(env or {})}
    return distrun("exec", "-i", str(path), *args, home=tmp_path / "home", env=full_env, timeout=120)


def as_json(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    return {entry["node"]: entry for entry in json.loads(result.stdout)}


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout


def test_hostname_on_every_host_returns_three_distinct_names(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--json", "--", "hostname")
    assert result.returncode == 0, result.stderr
    hosts = as_json(result)
    assert {node: entry["stdout"] for node, entry in hosts.items()} == {f"node{i}": f"node{i}" for i in range(3)}
    assert all(entry["rc"] == 0 and entry["error"] is None for entry in hosts.values())
    assert [entry["host"] for entry in hosts.values()] == [cluster3.addr(i) for i in range(3)]


def test_distinct_output_gets_one_block_per_host(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--", "hostname")
    assert result.returncode == 0
    assert result.stdout.split("\n")[1::4] == ["node0 (1)", "node1 (1)", "node2 (1)"]
    assert result.stderr == ""


def test_identical_output_is_gathered_under_the_host_range(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--", "echo", "same")
    assert result.returncode == 0
    assert result.stdout == "---------------\nnode[0-2] (3)\n---------------\nsame\n"


def test_failing_host_gets_its_own_block_and_the_summary(cluster3: Cluster, tmp_path: Path) -> None:
    script = "hostname | grep -q node1 && { echo same; exit 4; }; echo same"
    result = run_exec(cluster3, tmp_path, "--", "sh", "-c", script)
    assert result.returncode == 1
    assert "node[0,2] (2)\n---------------\nsame\n" in result.stdout
    assert "node1 (1): exit code 4\n---------------\nsame\n" in result.stdout
    assert result.stderr == "distrun: 1 of 3 hosts failed: node1 (exit code 4)\n"


def test_host_with_stopped_sshd_is_named_and_the_others_still_report(cluster3: Cluster, tmp_path: Path) -> None:
    cluster3.stop_sshd(1)
    try:
        result = run_exec(cluster3, tmp_path, "--", "hostname")
    finally:
        cluster3.start_sshd(1)
    assert result.returncode == 3
    assert "\nnode0\n" in result.stdout and "\nnode2\n" in result.stdout
    assert "node1 (1): unreachable\n---------------\nunreachable: connection refused\n" in result.stdout
    assert result.stderr == f"distrun: 1 of 3 hosts failed: node1 (unreachable)\ndistrun: fix: {REACH_HINT}\n"
    assert_no_traceback(result)


def test_cut_host_times_out_and_the_others_still_report(cluster3: Cluster, tmp_path: Path) -> None:
    cluster3.cut(2)
    try:
        result = run_exec(cluster3, tmp_path, "--json", "--", "hostname", env={"DISTRUN_SSH_TIMEOUT": "1"})
    finally:
        cluster3.restore(2)
    assert result.returncode == 3
    hosts = as_json(result)
    assert hosts["node0"]["stdout"] == "node0" and hosts["node1"]["stdout"] == "node1"
    assert hosts["node2"]["rc"] is None
    assert hosts["node2"]["error"] == f"node2 ({cluster3.addr(2)}:22): connection timed out after 1 s"


def test_wrong_identity_file_is_an_auth_failure_naming_the_host(cluster3: Cluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    result = run_exec(cluster3, tmp_path, "--nodes", "node1", "--", "hostname", identity_file=str(wrong))
    assert result.returncode == 3
    assert f"\nauthentication failed as root with {wrong}" in result.stdout
    assert result.stderr == f"distrun: 1 of 1 host failed: node1 (auth failed)\ndistrun: fix: {REACH_HINT}\n"
    assert_no_traceback(result)


def test_a_wrong_identity_file_on_every_host_is_said_once_under_the_host_range(cluster3: Cluster,
                                                                             tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    result = run_exec(cluster3, tmp_path, "--", "hostname", identity_file=str(wrong))
    assert result.returncode == 3
    assert result.stdout.splitlines()[1] == "node[0-2] (3): auth failed"
    assert result.stdout.count("authentication failed") == 1
    assert result.stderr.count(REACH_HINT) == 1


def test_unknown_host_key_is_refused_with_its_fingerprint(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--nodes", "node0", "--", "true", known_hosts=str(tmp_path / "empty"))
    pub = cluster3.state_dir / "node0" / "ssh_host_ed25519_key.pub"
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True).stdout.split()[1]
    assert result.returncode == 3
    assert f"unknown host key ED25519 {fingerprint}; to trust it: ssh-keyscan" in result.stdout
    assert result.stderr == "distrun: 1 of 1 host failed: node0 (unknown host key)\n"


def test_accept_new_runs_and_records_every_host(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    result = run_exec(cluster3, tmp_path, "--", "true", known_hosts=str(known), host_key_policy="accept-new")
    assert result.returncode == 0, result.stdout
    recorded = sorted(line.split()[0] for line in known.read_text().splitlines())
    assert recorded == sorted(cluster3.addr(i) for i in range(3))


def test_changed_host_key_is_refused(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    lines = cluster3.known_hosts.read_text().splitlines()
    other = cluster3.known_hosts.read_text().split("\n")[1].split()[2]
    known.write_text("\n".join(
        f"{line.split()[0]} ssh-ed25519 {other}" if line.startswith(cluster3.addr(0)) else line for line in lines
    ) + "\n")
    result = run_exec(cluster3, tmp_path, "--", "true", known_hosts=str(known), host_key_policy="accept-new")
    assert result.returncode == 3
    assert "node0 (1): host key changed\n---------------\nHOST KEY CHANGED" in result.stdout
    assert result.stderr == "distrun: 1 of 3 hosts failed: node0 (host key changed)\n"


def test_hostile_arguments_arrive_literally(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--json", "--", "python3", "-c", ECHO_ARGV, *HOSTILE)
    assert result.returncode == 0, result.stderr
    assert all(json.loads(entry["stdout"]) == HOSTILE for entry in as_json(result).values())
    assert all(cluster3.host_run(i, ["test", "-e", "/tmp/pwned"]).returncode != 0 for i in range(3))


def test_nodes_option_selects_hosts_and_unknown_names_get_a_suggestion(cluster3: Cluster, tmp_path: Path) -> None:
    chosen = run_exec(cluster3, tmp_path, "--json", "--nodes", "node2,node0", "--", "hostname")
    assert list(as_json(chosen)) == ["node0", "node2"]
    wrong = run_exec(cluster3, tmp_path, "--nodes", "node0,nod1", "--", "hostname")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        f"distrun: error: --nodes: unknown node 'nod1' in inventory {tmp_path / 'inventory.yaml'} "
        "(did you mean 'node1'?)"
    ]
    assert wrong.stdout == ""


def test_label_selects_the_hosts_that_carry_it(cluster3: Cluster, tmp_path: Path) -> None:
    labelled = [{"name": f"node{i}", "host": cluster3.addr(i), "labels": ["gpu"] if i else []} for i in range(3)]
    result = run_exec(cluster3, tmp_path, "--json", "--label", "gpu", "--", "hostname", nodes=labelled)
    assert list(as_json(result)) == ["node1", "node2"]
    missing = run_exec(cluster3, tmp_path, "--label", "tpu", "--", "hostname", nodes=labelled)
    assert missing.returncode == 2
    assert "--label tpu: no selected node" in missing.stderr and "labels there: gpu" in missing.stderr


def test_timeout_stops_the_command_and_fails(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--timeout", "1", "--nodes", "node0", "--json", "--",
                      "sh", "-c", "echo started; sleep 30")
    assert result.returncode == 1
    entry = as_json(result)["node0"]
    assert (entry["rc"], entry["stdout"], entry["error"]) == (None, "started", "node0: timed out after 1 s")


def test_timeout_ends_the_remote_command_and_its_children_on_the_host(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path, "--timeout", "1", "--nodes", "node1", "--",
                      "sh", "-c", "sleep 311 & sleep 312")
    assert result.returncode == 1

    def left() -> list[str]:
        return [" ".join(p.cmdline) for p in cluster3.processes(1) if {"311", "312"} & set(p.cmdline)]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), "the remote command outlived --timeout"


def test_missing_command_is_a_usage_error(cluster3: Cluster, tmp_path: Path) -> None:
    result = run_exec(cluster3, tmp_path)
    assert result.returncode == 2
    assert_no_traceback(result)


def test_exec_goes_through_the_bastion(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(3, bastion=True)
    result = run_exec(cluster, tmp_path, "--json", "--", "hostname")
    assert result.returncode == 0, result.stdout
    assert [entry["stdout"] for entry in as_json(result).values()] == ["node0", "node1", "node2"]


def test_sixteen_hosts_run_in_parallel(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(16)
    began = time.monotonic()
    result = run_exec(cluster, tmp_path, "--all", "--json", "--", "sh", "-c", "sleep 2; hostname")
    took = time.monotonic() - began
    assert result.returncode == 0, result.stdout
    assert took < 16, f"16 x 2 s took {took:.1f} s: not in parallel"
    assert {entry["stdout"] for entry in as_json(result).values()} == {f"node{i}" for i in range(16)}
    gathered = run_exec(cluster, tmp_path, "--all", "--", "echo", "same")
    assert gathered.stdout.splitlines()[1] == "node[0-15] (16)"
    refused = run_exec(cluster, tmp_path, "--", "echo", "same")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "exec: no hosts named, and the default is all 16 hosts" in refused.stderr
    assert "pass --all to mean every host" in refused.stderr
