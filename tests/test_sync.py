"""Which files `sync: true` sends, and how (no hosts needed: the local transport stands in for one).

The multi-host side (private workdirs, owner and modes as root) is in tests/cluster/test_sync_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.fanout.group import Group
from orchestrator.fanout.sync import decision, excluded, parse_rule, select_files, sync_workdirs
from orchestrator.plan import HostPlan, LaunchPlan
from orchestrator.spec import job_from_text
from orchestrator.spec.model import DEFAULT_SYNC_MAX_SIZE, NodeSpec, TransportKind

HAS_GIT = shutil.which("git") is not None


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"})


def ignores(pattern: str, path: str, is_dir: bool = False, base: str = "") -> bool:
    rule = parse_rule(pattern, base)
    assert rule is not None
    return excluded(decision([rule], path, is_dir))


@pytest.mark.parametrize(("pattern", "path", "is_dir", "expected"), [
    ("*.log", "out.log", False, True),
    ("*.log", "deep/er/out.log", False, True),
    ("*.log", "out.log.txt", False, False),
    ("/build", "build", True, True),
    ("/build", "src/build", True, False),
    ("build/", "src/build", True, True),
    ("build/", "build", False, False),
    ("doc/*.txt", "doc/a.txt", False, True),
    ("doc/*.txt", "doc/sub/a.txt", False, False),
    ("doc/*.txt", "x/doc/a.txt", False, False),
    ("**/cache", "a/b/cache", True, True),
    ("**/cache", "cache", True, True),
    ("a/**/z.py", "a/z.py", False, True),
    ("a/**/z.py", "a/b/c/z.py", False, True),
    ("data/**", "data/x/y.bin", False, True),
    ("file?.py", "file1.py", False, True),
    ("file?.py", "file/.py", False, False),
    ("[ab].py", "b.py", False, True),
    ("[!ab].py", "b.py", False, False),
    ("\\#notes", "#notes", False, True),
    ("\\!bang", "!bang", False, True),
    ("trailing.txt   ", "trailing.txt", False, True),
])
def test_gitignore_patterns_match_as_git_matches_them(pattern: str, path: str, is_dir: bool, expected: bool) -> None:
    assert ignores(pattern, path, is_dir) is expected


def test_a_pattern_in_a_nested_ignore_file_applies_below_its_directory_only() -> None:
    assert ignores("/out", "sub/out", True, base="sub") and not ignores("/out", "out", True, base="sub")
    assert ignores("*.tmp", "sub/a/b.tmp", base="sub") and not ignores("*.tmp", "b.tmp", base="sub")


def test_comments_and_blank_lines_are_no_rules() -> None:
    assert parse_rule("# a comment") is None and parse_rule("   ") is None and parse_rule("") is None


PROJECT = {
    "train.py": "print()\n",
    "pkg/model.py": "x = 1\n",
    "id_utils.py": "ID = 1\n",
    "out.log": "log\n",
    "runs/1/ckpt.pt": "weights\n",
    "runs/keep.txt": "x\n",
    "sub/.gitignore": "*.tmp\n!keep.tmp\n",
    "sub/a.tmp": "x\n",
    "sub/keep.tmp": "x\n",
    ".gitignore": "*.log\nruns/\n!runs/keep.txt\n",
    ".env": "TOKEN=1\n",
    ".env.example": "TOKEN=\n",
    "deploy/id_ed25519": "key\n",
    "tls/server.pem": "cert\n",
    ".ssh/config": "Host x\n",
    ".venv/lib/site.py": "x\n",
    "pkg/__pycache__/model.cpython-311.pyc": "x\n",
}
SENT = [".gitignore", "id_utils.py", "pkg/model.py", "sub/.gitignore", "sub/keep.tmp", "train.py"]
SECRETS = [".env", ".env.example", ".ssh/", "deploy/id_ed25519", "tls/server.pem"]


def test_outside_git_the_gitignore_files_and_the_defaults_decide_what_is_sent(tmp_path: Path) -> None:
    selection = select_files(tree(tmp_path, PROJECT))

    # runs/ is excluded as a directory, so `!runs/keep.txt` cannot bring keep.txt back, as in git.
    assert sorted(selection.files) == SENT
    assert selection.secrets == SECRETS


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_in_a_git_work_tree_what_git_would_commit_is_sent(tmp_path: Path) -> None:
    root = tree(tmp_path, PROJECT)
    git(root, "init", "-q")
    git(root, "add", "-f", "out.log", ".env", "train.py")  # tracked: git lists them whatever .gitignore says

    selection = select_files(root)

    assert sorted(selection.files) == sorted([*SENT, "out.log"])
    assert selection.secrets == SECRETS
    assert not any(name.startswith(".git/") for name in selection.files)


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_a_directory_its_repository_ignores_is_sent_as_outside_git(tmp_path: Path) -> None:
    repo = tree(tmp_path, {".gitignore": "experiments/\n", "experiments/run.py": "print()\n",
                           "experiments/.gitignore": "*.log\n", "experiments/out.log": "log\n"})
    git(repo, "init", "-q")

    assert sorted(select_files(repo / "experiments").files) == [".gitignore", "run.py"]


def test_a_distrunignore_line_skips_more_and_a_bang_line_sends_what_a_default_skips(tmp_path: Path) -> None:
    root = tree(tmp_path, {**PROJECT, ".distrunignore": "# not for the hosts\npkg/\n!.env.example\n"})

    selection = select_files(root)

    assert sorted(selection.files) == sorted([".distrunignore", ".env.example", *SENT[:2], *SENT[3:]])
    assert ".env.example" not in selection.secrets and ".env" in selection.secrets


def test_links_and_special_files_are_never_sent(tmp_path: Path) -> None:
    root = tree(tmp_path, {"train.py": "x\n"})
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "etc").symlink_to("/etc")
    os.mkfifo(root / "pipe")

    assert sorted(select_files(root).files) == ["train.py"]


def sync_to(tmp_path: Path, workdir: Path, root: Path, max_size: int = DEFAULT_SYNC_MAX_SIZE) -> dict[str, int]:
    """Sync `root` to one host reached with the local transport, its workdir `workdir`."""
    node = NodeSpec(name="h0", host="localhost", transport=TransportKind.LOCAL, python=sys.executable)
    host = HostPlan(node="h0", host="localhost", node_rank=0, nproc=1, python=sys.executable, workdir=str(workdir),
                    argv=[], env={}, secret_names=[], iface=None)
    plan = LaunchPlan(job_id="s-1", job_name="s", spec_path=str(tmp_path / "job.yaml"), inventory_path="<built-in>",
                      backend="local", master_node="h0", master_addr="127.0.0.1", master_port=29500, nnodes=1,
                      hosts=[host], secrets={}, sync=True, sync_max_size=max_size)
    with Group([node]) as group:
        return sync_workdirs(plan, group, root)


def test_secret_looking_files_stay_here_and_one_line_names_them(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = tree(tmp_path / "project", PROJECT)
    workdir = tmp_path / "host"

    assert sync_to(tmp_path, workdir, root) == {"h0": len(SENT)}

    sent = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*") if p.is_file())
    assert sent == SENT
    assert capsys.readouterr().err == (
        "distrun: sync: not sending 5 secret-looking file(s): .env, .env.example, .ssh/, deploy/id_ed25519, "
        "tls/server.pem (to send one, add a line like '!.env' to .distrunignore)\n")


def test_more_than_sync_max_size_is_refused_naming_the_largest_files_and_nothing_is_sent(tmp_path: Path) -> None:
    root = tree(tmp_path / "project", {"train.py": "x\n", "data/big.bin": "b" * 3000, "data/mid.bin": "m" * 1500})
    workdir = tmp_path / "host"

    with pytest.raises(UsageError) as caught:
        sync_to(tmp_path, workdir, root, max_size=4096)

    assert str(caught.value) == (
        f"sync: {root} has 4.4 KiB to send, over the limit of 4.0 KiB (largest: data/big.bin 2.9 KiB, "
        "data/mid.bin 1.5 KiB, train.py 2 B); list what the job does not need in .distrunignore, "
        f"or raise sync_max_size in {tmp_path / 'job.yaml'}")
    assert not workdir.exists()


def test_the_tar_is_streamed_not_held_in_memory(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    with open(root / "weights.bin", "wb") as out:
        for _ in range(64):
            out.write(os.urandom(1 << 20))
    workdir = tmp_path / "host"
    tracemalloc.start()
    try:
        sent = sync_to(tmp_path, workdir, root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert sent == {"h0": 1} and (workdir / "weights.bin").stat().st_size == 64 << 20
    assert peak < 16 << 20  # holding the file and then the tar took 3 x 64 MiB


@pytest.mark.parametrize(("value", "size"), [("512MiB", 512 << 20), ("2G", 2 << 30), ("1.5 GiB", 3 << 29),
                                             ("10kb", 10240), ("4096", 4096)])
def test_sync_max_size_takes_bytes_or_a_number_with_a_binary_unit(tmp_path: Path, value: str, size: int) -> None:
    job = job_from_text(f"name: s\nmodule: pkg.train\nsync: true\nsync_max_size: {value}\n", "job.yaml")
    assert job.sync_max_size == size


@pytest.mark.parametrize("value", ["0", "-1", "lots", "1e9", "true", "5 PB"])
def test_a_sync_max_size_that_is_not_a_size_is_refused_at_its_line(value: str) -> None:
    with pytest.raises(UsageError) as caught:
        job_from_text(f"name: s\nmodule: pkg.train\nsync: true\nsync_max_size: {value}\n", "job.yaml")
    assert str(caught.value).startswith("job.yaml:4: sync_max_size: must be a size of at least 1 byte, got ")
