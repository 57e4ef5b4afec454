"""`sync: true` to hosts that share no filesystem (each has its own tmpfs on /srv/node), as root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import distrun

from .fixtures import requires_cluster
from .harness import Cluster

pytestmark = requires_cluster

TRAIN = "import os\nprint('CWD', os.getcwd())\n"


@pytest.fixture(scope="module")
def private2(_stale_cleaned: None) -> Iterator[Cluster]:
    """Two hosts with private /srv/node directories, shared by this module's tests."""
    with Cluster(2, private_dirs=True) as cluster:
        yield cluster


def project(tmp_path: Path, workdir: str, extra: str = "") -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "job.yaml").write_text(f"name: sync\nscript: train.py\nnproc_per_node: 1\nsync: true\n"
                                   f"workdir: {workdir}\n{extra}")
    return root


def launch(cluster: Cluster, tmp_path: Path, root: Path):
    inventory = cluster.write_inventory(tmp_path / "inventory.yaml")
    return distrun("launch", "job.yaml", "-i", str(inventory), home=tmp_path / "home", cwd=root)


def stat_on(cluster: Cluster, host: int, path: str) -> str:
    return cluster.host_run(host, ["stat", "-c", "%u:%g %a", path]).stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="the test gives a file another owner")
def test_synced_files_belong_to_the_ssh_user_without_setuid_setgid_or_world_write(
        private2: Cluster, tmp_path: Path) -> None:
    root = project(tmp_path, "/srv/node/owners")
    tool = root / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, 1234, 1234)
    tool.chmod(0o4777)
    shared = root / "shared.cfg"
    shared.write_text("x\n")
    os.chown(shared, 1234, 1234)
    shared.chmod(0o2666)

    result = launch(private2, tmp_path, root)

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for host in range(private2.n):
        assert stat_on(private2, host, "/srv/node/owners/bin/tool") == "0:0 755"
        assert stat_on(private2, host, "/srv/node/owners/shared.cfg") == "0:0 644"
        assert stat_on(private2, host, "/srv/node/owners/bin") == "0:0 755"


def test_sync_leaves_ignored_and_secret_looking_files_behind_and_says_so_once(
        private2: Cluster, tmp_path: Path) -> None:
    root = project(tmp_path, "/srv/node/secrets")
    for name, text in {".env": "TOKEN=1\n", "keys/id_ed25519": "key\n", "tls/server.pem": "cert\n",
                       ".gitignore": "*.log\n", "run.log": "log\n", "id_utils.py": "x = 1\n"}.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)

    result = launch(private2, tmp_path, root)

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.count("secret-looking") == 1
    assert ("distrun: sync: not sending 3 secret-looking file(s): .env, keys/id_ed25519, tls/server.pem "
            "(to send one, add a line like '!.env' to .distrunignore)\n") in result.stderr
    for host in range(private2.n):
        listing = private2.host_run(host, ["find", "/srv/node/secrets", "-type", "f"]).stdout.split()
        assert sorted(listing) == [f"/srv/node/secrets/{n}" for n in (".gitignore", "id_utils.py", "job.yaml",
                                                                       "train.py")]


def test_a_workdir_over_sync_max_size_is_refused_before_any_host_is_written(private2: Cluster, tmp_path: Path) -> None:
    root = project(tmp_path, "/srv/node/big", extra="sync_max_size: 1MiB\n")
    (root / "weights.bin").write_bytes(b"\0" * (2 << 20))

    result = launch(private2, tmp_path, root)

    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.startswith(f"distrun: error: sync: {root} has 2.0 MiB to send, over the limit of 1.0 MiB")
    assert "raise sync_max_size in job.yaml" in result.stderr
    for host in range(private2.n):
        assert private2.host_run(host, ["test", "-e", "/srv/node/big"]).returncode == 1


def test_a_script_launch_syncs_the_current_directory_with_sync_and_workdir_flags(
        private2: Cluster, tmp_path: Path) -> None:
    root = tmp_path / "scripted"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    inventory = private2.write_inventory(tmp_path / "inventory.yaml")

    result = distrun("launch", "train.py", "-i", str(inventory), "--nproc-per-node", "1", "--sync",
                     "--workdir", "/srv/node/scripted", home=tmp_path / "home", cwd=root)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("CWD /srv/node/scripted") == 2
    assert private2.host_run(1, ["cat", "/srv/node/scripted/train.py"]).stdout == TRAIN
