"""The SSH transport's pure parts: quoting, ssh_config resolution, host-key decisions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import UsageError
from orchestrator.spec.model import HostKeyPolicy, NodeSpec
from orchestrator.transport.base import ConnectError, ConnectFailure
from orchestrator.transport.known_hosts import HostKeyChecker, KnownHosts, key_description
from orchestrator.transport.ssh import SSHTransport, command_line
from orchestrator.transport.ssh_config import SshTarget, connect_timeout, load_ssh_config, resolve_route

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
    assert route.target == SshTarget("10.9.0.11", 2222, "alice", (gpu_key,), False, identities_from_config=True)
    assert route.jumps == (SshTarget("10.9.0.2", 22, "bob", ("/keys/jump",), False, identities_from_config=True),)


def test_inventory_values_override_ssh_config(ssh_config: Path) -> None:
    node = NodeSpec(name="g1", host="gpu1", user="root", port=22, identity_file="/k/id", proxy_jump="ops@10.1.1.1:2200")
    route = resolve_route(node, load_ssh_config())
    assert route.target == SshTarget("10.9.0.11", 22, "root", ("/k/id",), use_default_keys=False)
    assert route.jumps == (SshTarget("10.1.1.1", 2200, "ops", ("/k/id",), use_default_keys=False),)


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
    assert route.hops == (SshTarget("10.0.0.5", 22, "root", (), use_default_keys=True),)


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


SERVER = SshTarget("10.0.0.7", 22, "root", ())


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
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SshTarget("h", 2222, "u", ()), host_keys[0])
    assert path.read_text().startswith("[h]:2222 ")


def test_accept_new_from_many_threads_writes_whole_lines(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    checker = HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW)
    threads = [threading.Thread(target=checker.check, args=("n", SshTarget(f"10.0.1.{i}", 22, "u", ()), host_keys[0]))
               for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    hosts = paramiko.HostKeys(str(path))
    assert all(hosts.lookup(f"10.0.1.{i}") for i in range(32))


def line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker} {names} {key.get_name()} {key.get_base64()}\n".lstrip()


def refusal(path: Path, key: paramiko.PKey, policy: HostKeyPolicy = HostKeyPolicy.STRICT,
            server: SshTarget = SERVER) -> ConnectError:
    with pytest.raises(ConnectError) as refused:
        HostKeyChecker(str(path), policy).check("node1 (10.0.0.7:22)", server, key)
    return refused.value


@pytest.mark.parametrize("policy", list(HostKeyPolicy))
def test_revoked_key_is_refused_naming_the_host_the_file_and_the_line(tmp_path: Path, host_keys, policy) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("10.0.0.7", host_keys[0]) + line("10.0.0.7", host_keys[0], "@revoked"))
    refused = refusal(path, host_keys[0], policy)
    assert str(refused) == (f"node1 (10.0.0.7:22): HOST KEY REVOKED: {path} line 2 marks "
                            f"{key_description(host_keys[0])} @revoked for 10.0.0.7; refusing to connect "
                            "(the host must be given a new key)")
    assert refused.failure is ConnectFailure.HOST_KEY_REVOKED
    assert len(path.read_text().splitlines()) == 2


def test_revoked_wildcard_refuses_the_key_on_every_host_but_not_other_keys(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("*", host_keys[1], "@revoked") + line("10.0.0.7", host_keys[0]))
    assert refusal(path, host_keys[1], HostKeyPolicy.ACCEPT_NEW,
                   SshTarget("10.9.9.9", 22, "u", ())).failure is ConnectFailure.HOST_KEY_REVOKED
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.parametrize("policy", list(HostKeyPolicy))
def test_a_host_trusted_only_through_a_cert_authority_is_refused_with_the_reason(
        tmp_path: Path, host_keys, policy) -> None:
    path = tmp_path / "known_hosts"
    before = "# site CA\n" + line("*.example.com,10.0.0.*", host_keys[1], "@cert-authority")
    path.write_text(before)
    refused = refusal(path, host_keys[0], policy)
    message = str(refused)
    assert message.startswith(f"node1 (10.0.0.7:22): {path} line 2 trusts 10.0.0.7 through @cert-authority, "
                              "and distrun does not check host certificates; refusing to connect")
    assert f"ssh-keyscan -p 22 10.0.0.7 >> {path}" in message and "\n" not in message
    assert refused.failure is ConnectFailure.UNKNOWN_HOST_KEY
    assert path.read_text() == before


def test_a_recorded_key_beside_a_cert_authority_is_checked_as_usual(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("*", host_keys[1], "@cert-authority") + line("10.0.0.7", host_keys[0]))
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])
    assert refusal(path, host_keys[1]).failure is ConnectFailure.HOST_KEY_CHANGED


def test_a_cert_authority_for_other_hosts_leaves_this_host_unknown(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("*.example.com", host_keys[1], "@cert-authority"))
    assert refusal(path, host_keys[0]).failure is ConnectFailure.UNKNOWN_HOST_KEY
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SERVER, host_keys[0])
    assert path.read_text().splitlines()[1] == line("10.0.0.7", host_keys[0]).strip()


def test_lines_that_cannot_be_read_are_skipped_like_ssh_does(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    good = line("10.0.0.7", host_keys[0])
    path.write_text(
        "@cert-authority\n"                                    # marker and nothing else
        "@unknown-marker 10.0.0.7 ssh-ed25519 AAAA\n"          # a marker OpenSSH does not know
        f"10.0.0.7 {host_keys[1].get_name()} not*base64\n"      # bad base64
        "10.0.0.7 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5\n"          # a key cut short
        "10.0.0.7 ssh-unknown AAAA\n"                          # a key type paramiko lacks
        "10.0.0.7\n"                                           # too few fields
        f"   \t\n#{good}{good}"
    )
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])
    assert [entry.line for entry in KnownHosts.parse(path.read_text()).lookup("10.0.0.7")] == [9]


@pytest.mark.parametrize(("patterns", "name", "found"), [
    ("10.0.0.*", "10.0.0.7", True),
    ("10.0.0.?", "10.0.0.17", False),
    ("*.example.com,!bad.example.com", "bad.example.com", False),
    ("*.example.com,!bad.example.com", "good.example.com", True),
    ("[gpu*]:2222", "[gpu7]:2222", True),
    ("[gpu*]:2222", "gpu7", False),
    ("GPU7", "gpu7", True),
])
def test_host_patterns_match_as_openssh_matches_them(patterns: str, name: str, found: bool, host_keys) -> None:
    known = KnownHosts.parse(line(patterns, host_keys[0]))
    assert bool(known.lookup(name)) is found


def test_hashed_host_names_are_found(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("10.0.0.7")
    path.write_text(line(paramiko.HostKeys.hash_host("10.0.0.8"), host_keys[1]) + line(hashed, host_keys[0]))
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])
    assert refusal(path, host_keys[1]).failure is ConnectFailure.HOST_KEY_CHANGED


def test_the_file_is_parsed_once_for_any_number_of_hosts(tmp_path: Path, host_keys, monkeypatch) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("".join(line(f"10.0.2.{i}", host_keys[0]) for i in range(200)))
    parses: list[int] = []
    parse = KnownHosts.parse
    monkeypatch.setattr(KnownHosts, "parse", lambda text: parses.append(1) or parse(text))
    for i in range(200):
        checker = HostKeyChecker(str(path), HostKeyPolicy.STRICT)
        server = SshTarget(f"10.0.2.{i}", 22, "u", ())
        assert checker.known_types("n", server) == [host_keys[0].get_name()]
        checker.check("n", server, host_keys[0])
    assert len(parses) == 1


def test_a_key_recorded_by_another_process_is_seen(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("10.0.0.1", host_keys[1]))
    assert refusal(path, host_keys[0]).failure is ConnectFailure.UNKNOWN_HOST_KEY
    with path.open("a") as out:
        out.write(line("10.0.0.7", host_keys[0]))
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])


def test_a_file_replaced_on_disk_is_read_again(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("10.0.0.7", host_keys[0]))
    HostKeyChecker(str(path), HostKeyPolicy.STRICT).check("n", SERVER, host_keys[0])
    replacement = tmp_path / "known_hosts.new"  # as `ssh-keygen -R` does it: a new file renamed over the old
    replacement.write_text(line("10.0.0.7", host_keys[1]))
    replacement.rename(path)
    assert refusal(path, host_keys[0]).failure is ConnectFailure.HOST_KEY_CHANGED


def test_accept_new_does_not_read_the_file_again_after_its_own_appends(tmp_path: Path, host_keys, monkeypatch) -> None:
    path = tmp_path / "known_hosts"
    parses: list[int] = []
    parse = KnownHosts.parse
    monkeypatch.setattr(KnownHosts, "parse", lambda text: parses.append(1) or parse(text))
    for i in range(50):
        HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SshTarget(f"10.0.3.{i}", 22, "u", ()),
                                                                  host_keys[0])
    assert len(parses) == 2  # the missing file, then the file once created
    assert len(path.read_text().splitlines()) == 50
    assert [entry.line for entry in KnownHosts.parse(path.read_text()).lookup("10.0.3.49")] == [50]


def test_accept_new_records_a_host_reached_by_many_threads_once(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    checker = HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW)
    threads = [threading.Thread(target=checker.check, args=("jump", SERVER, host_keys[0])) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert path.read_text() == line("10.0.0.7", host_keys[0])


def test_accept_new_ends_an_unterminated_last_line_first(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("10.0.0.1", host_keys[1]).rstrip("\n"))
    HostKeyChecker(str(path), HostKeyPolicy.ACCEPT_NEW).check("n", SERVER, host_keys[0])
    assert path.read_text() == line("10.0.0.1", host_keys[1]) + line("10.0.0.7", host_keys[0])


def test_an_unreadable_known_hosts_refuses_the_host_in_one_line(tmp_path: Path, host_keys) -> None:
    (tmp_path / "known_hosts").mkdir()
    refused = refusal(tmp_path / "known_hosts", host_keys[0])
    assert str(refused) == f"node1 (10.0.0.7:22): cannot check its host key: cannot read {tmp_path}/known_hosts: " \
                           "is a directory"
    assert refused.failure is ConnectFailure.UNKNOWN_HOST_KEY


def test_known_types_name_recorded_keys_only(tmp_path: Path, host_keys) -> None:
    path = tmp_path / "known_hosts"
    # Any 32 bytes make an Ed25519 public key: a CA key of another type than the host's.
    ed25519 = paramiko.PKey.from_type_string("ssh-ed25519", bytes.fromhex(
        "0000000b7373682d65643235353139000000201d6b9b0a6e0a1b1c9f1f3d5d8e0a4b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2"))
    path.write_text(line("*", ed25519, "@cert-authority") + line("10.0.0.7", host_keys[0]))
    assert HostKeyChecker(str(path), HostKeyPolicy.STRICT).known_types("n", SERVER) == [host_keys[0].get_name()]


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



def test_aead_ciphers_are_offered_first_and_nothing_is_added_or_dropped() -> None:
    from orchestrator.transport.ssh import AEAD_CIPHERS, _prefer_aead_ciphers

    left, right = socket.socketpair()
    try:
        link = paramiko.Transport(left)
        before = list(link.get_security_options().ciphers)
        _prefer_aead_ciphers(link)
        after = list(link.get_security_options().ciphers)
    finally:
        left.close()
        right.close()
    assert after[:len(AEAD_CIPHERS)] == list(AEAD_CIPHERS)
    assert sorted(after) == sorted(before)
