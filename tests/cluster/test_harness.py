"""The cluster harness itself, checked with the plain OpenSSH client from the controller."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from .fixtures import MakeCluster, requires_cluster
from .harness import PRIVATE_DIR, Cluster, Proc, cleanup_stale
from .registry import CHECKOUT, ETC_NETNS, NETNS_DIR, REGISTRY

pytestmark = requires_cluster


def ssh(cluster: Cluster, i: int, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cluster.ssh_argv(i), command], capture_output=True, text=True, timeout=timeout)


def tcp_connects(addr: str, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((addr, 22), timeout=timeout):
            return True
    except OSError:
        return False


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_hosts_report_distinct_hostnames(cluster3: Cluster) -> None:
    names = [ssh(cluster3, i, "hostname").stdout.strip() for i in range(3)]

    assert names == ["node0", "node1", "node2"]


def test_hosts_resolve_each_other_by_name_both_ways(cluster3: Cluster) -> None:
    forward = ssh(cluster3, 0, "getent hosts node1 node2").stdout.split()
    reverse = ssh(cluster3, 0, f"getent hosts {cluster3.addr(2)}").stdout.split()
    connect = ssh(cluster3, 0, "python3 -c 'import socket; socket.create_connection((\"node1\", 22), 2)'")

    assert forward == [cluster3.addr(1), "node1", cluster3.addr(2), "node2"]
    assert reverse == [cluster3.addr(2), "node2"]
    assert connect.returncode == 0, connect.stderr


LOOKUP_SECONDS = """
import socket, sys, time
began = time.monotonic()
try:
    socket.gethostbyaddr(sys.argv[1])
except OSError:
    print(time.monotonic() - began)
"""


def test_resolver_on_hosts_gives_up_on_unknown_addresses_within_a_second(cluster3: Cluster) -> None:
    unlisted = str(cluster3.subnet[250])
    resolv_conf = ssh(cluster3, 1, "cat /etc/resolv.conf").stdout
    lookup = ssh(cluster3, 1, f"python3 -c {shlex.quote(LOOKUP_SECONDS)} {unlisted}")

    assert resolv_conf == "options timeout:1 attempts:1\n"
    assert float(lookup.stdout) < 2


def test_inventory_lists_every_host_with_the_clusters_keys(cluster3: Cluster, tmp_path: Path) -> None:
    path = cluster3.write_inventory(tmp_path / "inventory.yaml", python="python3", known_hosts=None)
    inventory = yaml.safe_load(path.read_text())

    assert inventory["defaults"] == {
        "user": "root",
        "port": 22,
        "identity_file": str(cluster3.client_key),
        "host_key_policy": "strict",
        "python": "python3",
        "iface": "eth0",
    }
    assert inventory["nodes"] == [{"name": f"node{i}", "host": cluster3.addr(i)} for i in range(3)]
    assert yaml.safe_load(cluster3.write_inventory().read_text())["defaults"]["python"] == sys.executable


def test_known_hosts_holds_a_distinct_key_per_host_under_address_and_name(cluster3: Cluster) -> None:
    entries = [line.split() for line in cluster3.known_hosts.read_text().splitlines()]

    assert [names for names, _, _ in entries] == [f"{cluster3.addr(i)},node{i}" for i in range(3)]
    assert len({key for _, _, key in entries}) == 3


def test_processes_finds_session_and_daemonised_processes_by_environment(cluster3: Cluster) -> None:
    job_id = uuid.uuid4().hex

    def job_sleeps() -> list[Proc]:
        # A daemonised job passes through `setsid` before it becomes `sleep`.
        return [p for p in cluster3.processes_with_env(1, "DISTRUN_TEST_JOB", job_id) if p.cmdline == ("sleep", "60")]

    session = subprocess.Popen(
        [*cluster3.ssh_argv(1), f"DISTRUN_TEST_JOB={job_id} exec sleep 60"], stdin=subprocess.DEVNULL
    )
    ssh(cluster3, 1, f"DISTRUN_TEST_JOB={job_id} setsid sleep 60 </dev/null >/dev/null 2>&1 &")
    try:
        deadline = time.monotonic() + 10
        while len(found := job_sleeps()) < 2:
            assert time.monotonic() < deadline, f"job processes not found: {found}"
            time.sleep(0.05)
        killed = cluster3.kill_all(1)
    finally:
        session.kill()
        session.wait()

    assert {proc.pid for proc in found} <= {proc.pid for proc in killed}
    assert cluster3.processes_with_env(1, "DISTRUN_TEST_JOB", job_id) == []
    assert cluster3.processes_with_env(0, "DISTRUN_TEST_JOB", job_id) == []
    assert ssh(cluster3, 1, "hostname").stdout.strip() == "node1"


def test_private_dirs_are_seen_only_by_their_host(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2, private_dirs=True)
    marker = f"{PRIVATE_DIR}/marker-{cluster.prefix}"

    written = ssh(cluster, 0, f"echo from-node0 > {marker}")

    assert written.returncode == 0, written.stderr
    assert cluster.host_run(0, ["cat", marker]).stdout == "from-node0\n"
    assert cluster.host_run(1, ["test", "-e", marker]).returncode == 1
    assert ssh(cluster, 1, f"test -e {marker}").returncode == 1
    assert not Path(marker).exists()


def test_cut_host_is_unreachable_until_restored(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)

    cluster.cut(1)
    while_cut = tcp_connects(cluster.addr(1))
    other_while_cut = tcp_connects(cluster.addr(0))
    cluster.restore(1)

    assert not while_cut
    assert other_while_cut
    assert ssh(cluster, 1, "hostname").stdout.strip() == "node1"


def test_cut_during_cuts_a_host_while_a_launch_runs_and_always_plugs_it_back_in_and_ends_the_launch(
        make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    # A "launch" that ends once host 1 no longer answers.
    probe = (f"import socket, time\nwhile True:\n    try:\n        socket.create_connection(('{cluster.addr(1)}', 22), "
             "timeout=1).close()\n        time.sleep(0.2)\n    except OSError:\n        break\n")
    ends_on_cut = subprocess.Popen([sys.executable, "-c", probe])
    before = time.time()
    cut_at = cluster.cut_during(ends_on_cut, 1, 30, ready=lambda: time.time() > before + 0.5)
    assert ends_on_cut.returncode == 0 and before + 0.5 < cut_at <= time.time() and tcp_connects(cluster.addr(1))

    hangs = subprocess.Popen(["sleep", "60"])
    with pytest.raises(subprocess.TimeoutExpired):
        cluster.cut_during(hangs, 1, 0.5, ready=lambda: True)
    assert hangs.poll() is not None and tcp_connects(cluster.addr(1))

    ended = subprocess.Popen(["true"])
    ended.wait()
    with pytest.raises(RuntimeError, match="ended before host 1 could be cut\nits output"):  # a ClusterError
        cluster.cut_during(ended, 1, 5, ready=lambda: False, says=lambda: "its output")


def test_stopped_sshd_refuses_then_restarts_with_the_same_host_key(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(1, private_dirs=True)
    ssh(cluster, 0, f"touch {PRIVATE_DIR}/kept")

    cluster.stop_sshd(0)
    refused = ssh(cluster, 0, "hostname")
    cluster.start_sshd(0)
    again = ssh(cluster, 0, f"hostname; ls {PRIVATE_DIR}")

    assert refused.returncode == 255
    assert "refused" in refused.stderr
    assert again.stdout.split() == ["node0", "kept"], again.stderr


def test_bastion_is_the_only_way_to_reach_hosts(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2, bastion=True)
    direct = ["ssh", "-F", str(cluster.ssh_config), f"root@{cluster.addr(0)}", "hostname"]

    assert not tcp_connects(cluster.addr(0))
    assert subprocess.run(direct, capture_output=True, timeout=30).returncode == 255
    assert [ssh(cluster, i, "hostname").stdout.strip() for i in range(2)] == ["node0", "node1"]
    assert "-J" in cluster.ssh_argv(0)
    inventory = yaml.safe_load(cluster.write_inventory().read_text())
    assert inventory["defaults"]["proxy_jump"] == f"root@{cluster.bastion_addr}"


def test_teardown_leaves_no_namespace_link_process_or_file_behind() -> None:
    with Cluster(2, private_dirs=True, bastion=True) as cluster:
        namespaces = [cluster.ns(i) for i in range(2)] + [f"{cluster.prefix}-bastion"]
        links = [f"{cluster.prefix}br", f"{cluster.prefix}cb", f"{cluster.prefix}hb", f"{cluster.prefix}h0"]
        pids = [int((cluster.state_dir / f"node{i}" / "sshd.pid").read_text()) for i in range(2)]
        session = subprocess.Popen([*cluster.ssh_argv(0), "sleep 60"], stdin=subprocess.DEVNULL)
        assert all(link_exists(link) for link in links)
    cluster.teardown()
    session.wait(timeout=10)

    assert [ns for ns in namespaces if (NETNS_DIR / ns).exists() or (ETC_NETNS / ns).exists()] == []
    assert [link for link in links if link_exists(link)] == []
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert not cluster.state_dir.exists()
    assert not (REGISTRY / f"{cluster.prefix}.json").exists()
    assert str(cluster.subnet) not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_cleanup_stale_removes_a_killed_run_and_spares_live_ones(cluster3: Cluster) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster", "up", "-n", "2"], cwd=CHECKOUT, stdout=subprocess.PIPE, text=True
    )
    assert up.stdout is not None
    prefix = up.stdout.readline().removeprefix("prefix: ").strip()
    inventory = Path(up.stdout.readline().removeprefix("inventory: ").strip())
    sshd_pids = [int((inventory.parent / f"node{i}" / "sshd.pid").read_text()) for i in range(2)]
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    assert all(pid_alive(pid) for pid in sshd_pids)

    removed = cleanup_stale()  # a concurrent session's cleanup may have beaten us to it

    assert cluster3.prefix not in removed
    assert not (NETNS_DIR / f"{prefix}-n0").exists()
    assert not (ETC_NETNS / f"{prefix}-n1").exists()
    assert not link_exists(f"{prefix}br")
    assert not inventory.exists()
    assert not (REGISTRY / f"{prefix}.json").exists()
    assert [pid for pid in sshd_pids if pid_alive(pid)] == []
    assert ssh(cluster3, 0, "hostname").stdout.strip() == "node0"


def test_two_clusters_side_by_side_get_their_own_names_and_subnets(
    cluster3: Cluster, make_cluster: MakeCluster
) -> None:
    other = make_cluster(1)

    assert other.prefix != cluster3.prefix
    assert not other.subnet.overlaps(cluster3.subnet)
    assert ssh(other, 0, "hostname").stdout.strip() == "node0"
    assert ssh(cluster3, 0, "hostname").stdout.strip() == "node0"


def test_sixteen_hosts_come_up_and_answer_over_ssh(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(16)

    with ThreadPoolExecutor(max_workers=16) as pool:
        names = list(pool.map(lambda i: ssh(cluster, i, "hostname").stdout.strip(), range(16)))

    assert names == [f"node{i}" for i in range(16)]


@pytest.mark.parametrize("n", [0, 245])
def test_host_count_out_of_range_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="1 to 244 hosts"):
        Cluster(n)
