"""The SSH transport against real sshd hosts of the namespace test cluster."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.fanout.group import Group, GroupError
from orchestrator.spec import NodeSpec, load_inventory
from orchestrator.transport import ssh
from orchestrator.transport.base import ConnectError, ConnectFailure
from orchestrator.transport.ssh import SSHTransport
from tests.cluster.fixtures import MakeCluster
from tests.cluster.harness import Cluster, skip_reason
from tests.helpers import distrun

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

HOSTILE = ["; rm -rf /tmp/x", "$(touch /tmp/pwned)", "`id`", "it's \"quoted\"", "a\nb", "ünï €", "*", "", "-n"]
ECHO_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"



@pytest.fixture(autouse=True)
def no_user_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(tmp_path / "no-ssh-config"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def nodes(cluster: Cluster, tmp_path: Path, **overrides: object) -> list[NodeSpec]:
    path = cluster.write_inventory(tmp_path / f"inventory-{time.monotonic_ns()}.yaml", **overrides)
    return list(load_inventory(path).nodes)


def connected(node: NodeSpec) -> SSHTransport:
    transport = SSHTransport(node)
    transport.connect()
    return transport


def host_key_fingerprint(cluster: Cluster, i: int) -> str:
    pub = cluster.state_dir / cluster.name(i) / "ssh_host_ed25519_key.pub"
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_one_connection_serves_every_command(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    try:
        first = transport.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout
        second = transport.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout
    finally:
        transport.close()
    client_ip, client_port, server_port = first.split()
    assert first == second
    assert server_port == "22" and int(client_port) > 0 and client_ip.startswith("10.213.")


def test_peer_address_is_the_address_the_connection_reached(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[1])
    try:
        assert transport.peer_address() == cluster3.addr(1)
    finally:
        transport.close()


def test_hostile_arguments_arrive_literally(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    try:
        result = transport.run(["python3", "-c", ECHO_ARGV, *HOSTILE])
    finally:
        transport.close()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == HOSTILE
    assert cluster3.host_run(0, ["test", "-e", "/tmp/pwned"]).returncode != 0


def test_environment_and_directory_reach_the_command(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    env = {"DISTRUN_A": "two words", "DISTRUN_B": "$(id) 'q' \"d\""}
    script = "import os, json; print(json.dumps([os.getcwd(), os.environ['DISTRUN_A'], os.environ['DISTRUN_B']]))"
    try:
        proc = transport.start(["python3", "-c", script], env=env, cwd="/usr/share")
        lines: list[str] = []
        proc.stream(lines.append, lines.append)
        proc.close_stdin()
        assert proc.wait(30) == 0
    finally:
        transport.close()
    assert json.loads(lines[0]) == ["/usr/share", env["DISTRUN_A"], env["DISTRUN_B"]]


def test_exit_status_and_stderr_come_back(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[2])
    try:
        result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    finally:
        transport.close()
    assert (result.returncode, result.stdout, result.stderr) == (7, "out", "err")


def test_hundred_thousand_lines_are_all_delivered(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    lines: list[str] = []
    try:
        proc = transport.start(["python3", "-c", "for i in range(100000): print(i)"])
        proc.stream(lines.append, lines.append)
        proc.close_stdin()
        assert proc.wait(120) == 0
    finally:
        transport.close()
    assert lines == [str(i) for i in range(100000)]


def test_stdin_writes_reach_the_remote_command(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[1])
    script = "import sys, hashlib; data = sys.stdin.buffer.read(); print(len(data), hashlib.sha256(data).hexdigest())"
    payload = bytes(range(256)) * 8192
    try:
        result = transport.run(["python3", "-c", script], stdin=payload, timeout=60)
    finally:
        transport.close()
    assert result.stdout == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}"


def test_terminate_ends_the_wait(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    try:
        proc = transport.start(["sleep", "60"])
        proc.stream(lambda _line: None, lambda _line: None)
        assert proc.wait(0.5) is None
        proc.terminate()
        assert proc.wait(10) == ssh.NO_EXIT_STATUS
    finally:
        transport.close()


def test_wait_returns_when_the_host_side_of_the_connection_dies(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[2])
    try:
        proc = transport.start(["sleep", "60"])
        proc.stream(lambda _line: None, lambda _line: None)
        assert proc.wait(0.5) is None
        cluster3.kill_all(2)
        assert proc.wait(10) == ssh.NO_EXIT_STATUS
    finally:
        transport.close()


def test_wait_returns_when_the_link_is_cut(cluster3: Cluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ssh, "KEEPALIVE_EVERY", 1)
    monkeypatch.setattr(ssh, "DEAD_LINK_AFTER_MS", 2000)
    transport = connected(nodes(cluster3, tmp_path)[1])
    try:
        proc = transport.start(["sleep", "60"])
        proc.stream(lambda _line: None, lambda _line: None)
        cluster3.cut(1)
        began = time.monotonic()
        rc = proc.wait(30)
        took = time.monotonic() - began
    finally:
        cluster3.restore(1)
        transport.close()
        cluster3.kill_all(1)
    assert rc == ssh.NO_EXIT_STATUS
    assert took < 15


def test_unknown_host_key_is_refused_under_strict_with_its_fingerprint(cluster3: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    node = nodes(cluster3, tmp_path, known_hosts=str(empty))[0]
    with pytest.raises(ConnectError) as refused:
        SSHTransport(node).connect()
    message = str(refused.value)
    assert refused.value.failure is ConnectFailure.UNKNOWN_HOST_KEY
    assert message.startswith(f"node0 ({cluster3.addr(0)}:22): unknown host key ED25519 ")
    assert host_key_fingerprint(cluster3, 0) in message
    assert not empty.exists()


def test_the_suggested_ssh_keyscan_makes_the_host_trusted(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    node = nodes(cluster3, tmp_path, known_hosts=str(known))[1]
    with pytest.raises(ConnectError) as refused:
        SSHTransport(node).connect()
    command = str(refused.value).split("to trust it: ")[1].split(", or set")[0]
    subprocess.run(["sh", "-c", command], capture_output=True, check=True, timeout=30)
    connected(node).close()


def test_accept_new_accepts_and_records_the_key(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    node = nodes(cluster3, tmp_path, known_hosts=str(known), host_key_policy="accept-new")[2]
    connected(node).close()
    assert known.read_text().startswith(f"{cluster3.addr(2)} ssh-ed25519 ")
    strict = nodes(cluster3, tmp_path, known_hosts=str(known))[2]
    connected(strict).close()


def test_changed_host_key_is_refused_under_every_policy(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    known.write_text(f"{cluster3.addr(0)} {' '.join(Path(f'{impostor}.pub').read_text().split()[:2])}\n")
    for policy in ("strict", "accept-new"):
        node = nodes(cluster3, tmp_path, known_hosts=str(known), host_key_policy=policy)[0]
        with pytest.raises(ConnectError) as refused:
            SSHTransport(node).connect()
        message = str(refused.value)
        assert message.startswith(f"node0 ({cluster3.addr(0)}:22): HOST KEY CHANGED")
        assert host_key_fingerprint(cluster3, 0) in message
        assert refused.value.failure is ConnectFailure.HOST_KEY_CHANGED
    assert len(known.read_text().splitlines()) == 1


def test_wrong_identity_file_fails_authentication_naming_the_host(cluster3: Cluster, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    node = nodes(cluster3, tmp_path, identity_file=str(wrong))[1]
    with pytest.raises(ConnectError) as refused:
        SSHTransport(node).connect()
    assert str(refused.value) == (f"node1 ({cluster3.addr(1)}:22): authentication failed as root with {wrong} "
                                  "(check identity_file / user)")
    assert refused.value.failure is ConnectFailure.AUTH


def test_stopped_sshd_is_reported_unreachable(cluster3: Cluster, tmp_path: Path) -> None:
    node = nodes(cluster3, tmp_path)[2]
    cluster3.stop_sshd(2)
    try:
        with pytest.raises(ConnectError) as failed:
            SSHTransport(node).connect()
    finally:
        cluster3.start_sshd(2)
    assert str(failed.value) == f"node2 ({cluster3.addr(2)}:22): unreachable: connection refused"


def test_cut_host_times_out_after_the_connect_timeout(cluster3: Cluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_TIMEOUT", "1")
    node = nodes(cluster3, tmp_path)[1]
    cluster3.cut(1)
    try:
        began = time.monotonic()
        with pytest.raises(ConnectError) as failed:
            SSHTransport(node).connect()
        took = time.monotonic() - began
    finally:
        cluster3.restore(1)
    assert str(failed.value) == f"node1 ({cluster3.addr(1)}:22): connection timed out after 1 s"
    assert failed.value.failure is ConnectFailure.TIMEOUT
    assert took < 5


def test_ssh_config_supplies_what_the_inventory_leaves_out(cluster3: Cluster, tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host box\n  HostName {cluster3.addr(0)}\n  User root\n"
                      f"  IdentityFile {tmp_path / 'absent_key'}\n  IdentityFile {cluster3.client_key}\n")
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(config))
    inventory = cluster3.write_inventory(tmp_path / "inv.yaml", user=None, port=None, identity_file=None,
                                         nodes=[{"name": "box", "host": "box"}])
    transport = connected(load_inventory(inventory).nodes[0])
    try:
        assert transport.run(["hostname"]).stdout == "node0"
        assert transport.peer_address() == cluster3.addr(0)
    finally:
        transport.close()


def test_proxy_jump_reaches_hosts_the_controller_cannot(make_cluster: MakeCluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_TIMEOUT", "2")
    cluster = make_cluster(3, bastion=True)
    direct = nodes(cluster, tmp_path, proxy_jump=None)[0]
    with pytest.raises(ConnectError):
        SSHTransport(direct).connect()
    with Group(nodes(cluster, tmp_path)) as group:
        group.connect()
        names = [t.run(["hostname"]).stdout for t in group.transports.values()]
        peers = [t.peer_address() for t in group.transports.values()]
    assert names == ["node0", "node1", "node2"]
    assert peers == [cluster.addr(i) for i in range(3)]


def test_proxy_jump_from_ssh_config(make_cluster: MakeCluster, tmp_path: Path, monkeypatch) -> None:
    cluster = make_cluster(1, bastion=True)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host n0\n  HostName {cluster.addr(0)}\n  ProxyJump root@{cluster.bastion_addr}\n")
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(config))
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", proxy_jump=None, nodes=[{"name": "n0", "host": "n0"}])
    transport = connected(load_inventory(inventory).nodes[0])
    try:
        assert transport.run(["hostname"]).stdout == "node0"
    finally:
        transport.close()


def test_jump_host_key_is_verified_too(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(1, bastion=True)
    known = tmp_path / "known_hosts"
    lines = cluster.known_hosts.read_text().splitlines()
    known.write_text("".join(f"{line}\n" for line in lines if "bastion" not in line))
    node = nodes(cluster, tmp_path, known_hosts=str(known))[0]
    with pytest.raises(ConnectError) as refused:
        SSHTransport(node).connect()
    assert str(refused.value).startswith(f"node0 (jump host {cluster.bastion_addr}:22): unknown host key ED25519")


def test_unreachable_target_behind_the_jump_is_named(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(2, bastion=True)
    node = nodes(cluster, tmp_path)[1]
    cluster.stop_sshd(1)
    with pytest.raises(ConnectError) as failed:
        SSHTransport(node).connect()
    assert str(failed.value).startswith(f"node1 ({cluster.addr(1)}:22 via {cluster.bastion_addr}:22): unreachable")


def test_sixteen_hosts_connect_in_parallel(make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(16)
    began = time.monotonic()
    with Group(nodes(cluster, tmp_path)) as group:
        names = set(group.run(lambda t: t.run(["hostname"], timeout=60).stdout).check().values())
    assert names == {f"node{i}" for i in range(16)}
    assert time.monotonic() - began < 60


def test_a_group_connect_names_every_unreachable_host_folded_into_one_range(cluster3: Cluster, tmp_path: Path) -> None:
    cluster3.stop_sshd(0)
    cluster3.stop_sshd(2)
    try:
        with pytest.raises(GroupError) as failed, Group(nodes(cluster3, tmp_path)) as group:
            group.connect()
    finally:
        cluster3.start_sshd(0)
        cluster3.start_sshd(2)
    assert set(failed.value.failed) == {"node0", "node2"}
    assert all(isinstance(e, ConnectError) for e in failed.value.failed.values())
    assert str(failed.value).startswith("node[0,2]: unreachable")
    assert failed.value.exit_code == 3


def test_host_keys_file_left_alone_by_strict(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    shutil.copy(cluster3.known_hosts, known)
    before = known.read_bytes()
    connected(nodes(cluster3, tmp_path, known_hosts=str(known))[0]).close()
    assert known.read_bytes() == before


def test_jump_chain_passes_every_hop_in_order(make_cluster: MakeCluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_TIMEOUT", "2")
    cluster = make_cluster(1, bastion=True)
    bastion_line = next(line for line in cluster.known_hosts.read_text().splitlines() if "bastion" in line)
    inner = next(addr for addr in bastion_line.split()[0].split(",") if addr not in (cluster.bastion_addr, "bastion"))
    with pytest.raises(ConnectError, match="jump host"):
        SSHTransport(nodes(cluster, tmp_path, proxy_jump=f"root@{inner}")[0]).connect()
    transport = connected(nodes(cluster, tmp_path, proxy_jump=f"root@{cluster.bastion_addr},root@{inner}")[0])
    try:
        assert transport.run(["hostname"]).stdout == "node0"
    finally:
        transport.close()


def exec_true(cluster: Cluster, tmp_path: Path, known: Path) -> subprocess.CompletedProcess[str]:
    inventory = cluster.write_inventory(tmp_path / "inventory.yaml", known_hosts=str(known),
                                        host_key_policy="accept-new")
    env = {"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "SSH_AUTH_SOCK": ""}
    return distrun("exec", "-i", str(inventory), "--", "true", home=tmp_path / "home", env=env, timeout=120)


def host_key_line(cluster: Cluster, i: int) -> str:
    return next(line for line in cluster.known_hosts.read_text().splitlines() if line.startswith(f"{cluster.addr(i)},"))


def test_revoked_host_key_is_refused_with_exit_3_naming_host_and_file(cluster3: Cluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    key = host_key_line(cluster3, 0).split(maxsplit=1)[1]
    known.write_text(f"{cluster3.known_hosts.read_text()}@revoked {cluster3.addr(0)} {key}\n")
    before = known.read_text()
    result = exec_true(cluster3, tmp_path, known)
    assert result.returncode == 3, result.stdout
    fingerprint = host_key_fingerprint(cluster3, 0)
    # exec folds each host's error under its name (clush -b style): the host, then the whole message.
    assert "\nnode0 (1): host key revoked\n" in result.stdout
    assert (f"HOST KEY REVOKED: {known} line 4 marks ED25519 {fingerprint} "
            f"@revoked for {cluster3.addr(0)}; refusing to connect") in result.stdout
    assert result.stderr == "distrun: 1 of 3 hosts failed: node0 (host key revoked)\n"
    assert "Traceback" not in result.stdout + result.stderr
    assert known.read_text() == before


def test_host_trusted_only_by_a_cert_authority_is_refused_with_exit_3(cluster3: Cluster, tmp_path: Path) -> None:
    authority = tmp_path / "ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(authority)], check=True)
    known = tmp_path / "known_hosts"
    ca_line = f"@cert-authority 10.213.* {' '.join(Path(f'{authority}.pub').read_text().split()[:2])}\n"
    known.write_text(ca_line + "".join(f"{host_key_line(cluster3, i)}\n" for i in (1, 2)))
    before = known.read_text()
    result = exec_true(cluster3, tmp_path, known)
    assert result.returncode == 3, result.stdout
    assert "\nnode0 (1): unknown host key\n" in result.stdout
    assert (f"{known} line 1 trusts {cluster3.addr(0)} through @cert-authority, "
            "and distrun does not check host certificates; refusing to connect") in result.stdout
    assert result.stderr == "distrun: 1 of 3 hosts failed: node0 (unknown host key)\n"
    assert "Traceback" not in result.stdout + result.stderr
    assert known.read_text() == before


def test_connections_negotiate_aes_gcm_with_openssh(cluster3: Cluster, tmp_path: Path) -> None:
    transport = connected(nodes(cluster3, tmp_path)[0])
    try:
        link = transport._links[-1]
        assert (link.local_cipher, link.remote_cipher) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
        assert transport.run(["true"]).returncode == 0
    finally:
        transport.close()
