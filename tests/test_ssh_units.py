"""The SSH transport's pure parts: quoting, ssh_config resolution, host-key decisions."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import UsageError
from orchestrator.spec.model import HostKeyPolicy, NodeSpec
from orchestrator.transport.base import ConnectError, ConnectFailure
from orchestrator.transport.ssh import (
    Endpoint,
    HostKeyChecker,
    SSHTransport,
    command_line,
    connect_timeout,
    key_description,
    load_ssh_config,
    resolve_route,
)

HOSTILE = ["; rm -rf /tmp/x", "$(touch /tmp/pwned)", "`id`", "it's \"quoted\"", "a\nb", "ünï €", "*", "", "-n"]


def shell_words(line: str) -> list[str]:
    """What a POSIX shell makes of `line` when it runs `printf '%s\\0'` in place of `exec`."""
    script = line.replace("exec ", "exec printf '%s\\0' ", 1)
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def test_hostile_words_survive_the_remote_shell() -> None:
    assert shell_words(command_line(["python3", *HOSTILE])) == ["python3", *HOSTILE]


def test_environment_passes_through_env_words() -> None:
    line = command_line(["true"], env={"A": "x y", "B": "$(id)"})
    assert shell_words(line) == ["env", "A=x y", "B=$(id)", "true"]


def test_working_directory_is_entered_first(tmp_path: Path) -> None:
    odd = tmp_path / "dir with 'quote'"
    odd.mkdir()
    line = command_line(["pwd"], cwd=str(odd))
    assert subprocess.run(["sh", "-c", line], capture_output=True, text=True).stdout.strip() == str(odd)


@pytest.mark.parametrize("relative", ["", "sub dir"])
def test_working_directory_under_home_expands_the_tilde(relative: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "sub dir").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    line = command_line(["pwd"], cwd=f"~/{relative}" if relative else "~")
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True).stdout.strip()
    assert out == str(tmp_path / relative)


def test_missing_working_directory_fails_the_command() -> None:
    result = subprocess.run(["sh", "-c", command_line(["true"], cwd="/nonexistent/dir")], capture_output=True)
    assert result.returncode != 0


def test_bad_environment_name_is_refused() -> None:
    with pytest.raises(UsageError, match="invalid environment variable name 'A B'"):
        command_line(["true"], env={"A B": "1"})


def test_empty_command_is_refused() -> None:
    with pytest.raises(UsageError):
        command_line([])


@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text(
        "Host gpu1\n"
        "  HostName 10.9.0.11\n"
        "  User alice\n"
        "  Port 2222\n"
        "  IdentityFile ~/.ssh/gpu_key\n"
        "  ProxyJump jumper\n"
        "Host jumper\n"
        "  HostName 10.9.0.2\n"
        "  User bob\n"
        "  IdentityFile /keys/jump\n"
    )
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(path))
    return path


def test_ssh_config_alias_supplies_address_user_port_identity_and_jump(ssh_config: Path) -> None:
    route = resolve_route(NodeSpec(name="g1", host="gpu1"), load_ssh_config())
    gpu_key = os.path.expanduser("~/.ssh/gpu_key")
    assert route.target == Endpoint("10.9.0.11", 2222, "alice", (gpu_key,), False, identities_from_config=True)
    assert route.jumps == (Endpoint("10.9.0.2", 22, "bob", ("/keys/jump",), False, identities_from_config=True),)


def test_inventory_values_override_ssh_config(ssh_config: Path) -> None:
    node = NodeSpec(name="g1", host="gpu1", user="root", port=22, identity_file="/k/id", proxy_jump="ops@10.1.1.1:2200")
    route = resolve_route(node, load_ssh_config())
    assert route.target == Endpoint("10.9.0.11", 22, "root", ("/k/id",), use_default_keys=False)
    assert route.jumps == (Endpoint("10.1.1.1", 2200, "ops", ("/k/id",), use_default_keys=False),)


def test_jump_chain_is_followed_in_order(ssh_config: Path) -> None:
    route = resolve_route(NodeSpec(name="n", host="10.0.0.5", proxy_jump="a@10.0.0.1,jumper,[fd00::1]:23"),
                          load_ssh_config())
    me = route.target.user
    hops = [(hop.hostname, hop.port, hop.user) for hop in route.hops]
    assert hops == [("10.0.0.1", 22, "a"), ("10.9.0.2", 22, "bob"), ("fd00::1", 23, me), ("10.0.0.5", 22, me)]


def test_unparsable_jump_is_a_usage_error(ssh_config: Path) -> None:
    with pytest.raises(UsageError, match="proxy_jump"):
        resolve_route(NodeSpec(name="n", host="h", proxy_jump="a@b:notaport"), load_ssh_config())


def test_missing_ssh_config_means_plain_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(tmp_path / "absent"))
    route = resolve_route(NodeSpec(name="n", host="10.0.0.5", user="root"), load_ssh_config())
    assert route.hops == (Endpoint("10.0.0.5", 22, "root", (), use_default_keys=True),)


@pytest.mark.parametrize("raw", ["0", "-1", "soon"])
def test_bad_connect_timeout_is_a_usage_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_TIMEOUT", raw)
    with pytest.raises(UsageError, match="DISTRUN_SSH_TIMEOUT"):
        connect_timeout()


def test_connect_timeout_defaults_to_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_SSH_TIMEOUT", raising=False)
    assert connect_timeout() == 10.0


@pytest.fixture(scope="module")
def host_keys() -> tuple[paramiko.PKey, paramiko.PKey]:
    return paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()


SERVER = Endpoint("10.0.0.7", 22, "root", ())


def test_unknown_key_is_refused_under_strict_with_fingerprint_and_fix(tmp_path: Path, host_keys) -> None:
    checker = HostKeyChecker(str(tmp_path / "known_hosts"), HostKeyPolicy.STRICT)
    with pytest.raises(ConnectError) as refused:
        checker.check("node1 (10.0.0.7:22)", SERVER, host_keys[0])
    message = str(refused.value)
    assert refused.value.failure is ConnectFailure.UNKNOWN_HOST_KEY
    assert message.startswith("node1 (10.0.0.7:22): unknown host key ECDSA SHA256:")
    assert host_keys[0].fingerprint in message
    assert f"ssh-keyscan -p 22 10.0.0.7 >> {tmp_path / 'known_hosts'}" in message
    assert "host_key_policy: accept-new" in message
    assert "\n" not in message
    assert not (tmp_path / "known_hosts").exists()


def test_accept_new_records_the_key_and_then_knows_it(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "sub" / "known_hosts"
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SERVER, host_keys[0])
    assert path.read_text() == f"10.0.0.7 {host_keys[0].get_name()} {host_keys[0].get_base64()}\n"
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])


def test_changed_key_is_refused_even_under_accept_new(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SERVER, host_keys[0])
    with pytest.raises(ConnectError) as refused:
        HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("node1 (10.0.0.7:22)", SERVER, host_keys[1])
    message = str(refused.value)
    assert message.startswith("node1 (10.0.0.7:22): HOST KEY CHANGED")
    assert host_keys[0].fingerprint in message and host_keys[1].fingerprint in message
    assert refused.value.failure is ConnectFailure.HOST_KEY_CHANGED
    assert len(path.read_text().splitlines()) == 1


def test_non_standard_port_is_recorded_in_brackets(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", Endpoint("h", 2222, "u", ()), host_keys[0])
    assert path.read_text().startswith("[h]:2222 ")


def test_accept_new_from_many_threads_writes_whole_lines(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    checker = HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW)
    threads = [threading.Thread(target=checker.check, args=("n", Endpoint(f"10.0.1.{i}", 22, "u", ()), host_keys[0]))
               for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    hosts = paramiko.HostKeys(str(path))
    assert all(hosts.lookup(f"10.0.1.{i}") for i in range(32))


def test_importing_the_transport_leaves_invoke_unloaded_until_used() -> None:
    script = ("import sys, orchestrator.transport.ssh, paramiko\n"
              "print(type(sys.modules['invoke']).__name__)\n"
              "config = paramiko.SSHConfig.from_text('Match exec true\\n  User matched\\n')\n"
              "print(config.lookup('x')['user'], type(sys.modules['invoke']).__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["_Deferred", "matched", "module"]


def test_key_description_reads_like_ssh() -> None:
    key = paramiko.ECDSAKey.generate()
    assert key_description(key) == f"ECDSA {key.fingerprint}"


def test_refused_port_is_reported_unreachable_naming_the_node(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(tmp_path / "absent"))
    node = NodeSpec(name="node7", host="127.0.0.1", port=1, user="root", known_hosts=str(tmp_path / "kh"))
    transport = SSHTransport(node)
    with pytest.raises(ConnectError) as failed:
        transport.connect()
    assert str(failed.value) == "node7 (127.0.0.1:1): unreachable: connection refused"
    assert failed.value.failure is ConnectFailure.UNREACHABLE


def test_closed_transport_does_not_reconnect(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DISTRUN_SSH_CONFIG", str(tmp_path / "absent"))
    transport = SSHTransport(NodeSpec(name="node7", host="127.0.0.1", port=1))
    transport.close()
    with pytest.raises(Exception, match="connection closed"):
        transport.connect()

