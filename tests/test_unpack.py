"""The host side of workdir sync (`orchestrator.remote.unpack`): what a tar may write, and how.

Run here as the hosts run it: as root when the tests run as root, with and without tarfile's
`data` filter (hosts may have a python older than 3.8.17 / 3.11.4, which lack it).
"""

from __future__ import annotations

import ctypes
import io
import os
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from tests.helpers import REPO

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="only root's extraction can keep another owner")


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def run_unpack(root: Path, tar: bytes, filters: str = "data filter") -> subprocess.CompletedProcess[bytes]:
    """`unpack.py ROOT unpack` with the tar on stdin, as sync runs it on a host."""
    code = "import sys, tarfile; from orchestrator.remote import unpack; "
    if filters == "stdlib rules":
        code += "del tarfile.data_filter; "
    return subprocess.run([sys.executable, "-c", code + "unpack.main(sys.argv[1:])", str(root), "unpack"],
                          input=tar, capture_output=True, cwd=REPO, timeout=60, check=False)


def refusal(result: subprocess.CompletedProcess[bytes]) -> str:
    """The one line a refused tar leaves on stderr (exit 2)."""
    assert result.returncode == 2, result.stderr.decode()
    return result.stderr.decode()


def member(name: str, data: bytes = b"x\n", mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
           link: str = "", uid: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type, info.linkname = (len(data) if kind == tarfile.REGTYPE else 0), mode, kind, link
    info.uid = info.gid = uid
    info.uname = info.gname = "someone"
    return info, data


@pytest.fixture(params=["data filter", "stdlib rules"])
def filters(request: pytest.FixtureRequest) -> str:
    """Both ways a host checks members: tarfile's `data` filter, or a python without it."""
    return str(request.param)


@AS_ROOT
def test_root_owns_what_it_writes_and_no_mode_keeps_setuid_setgid_or_world_write(tmp_path: Path, filters: str) -> None:
    tar = tar_of(member("bin/tool", mode=0o4777, uid=1234), member("conf.txt", mode=0o2666, uid=1234),
                 member("data", mode=0o1777, kind=tarfile.DIRTYPE, uid=1234))

    result = run_unpack(tmp_path, tar, filters)
    assert result.returncode == 0 and result.stdout == b'{"written": 2}\n', result.stderr.decode()

    modes = {name: (tmp_path / name).stat() for name in ("bin/tool", "conf.txt", "data")}
    assert {name: (st.st_uid, st.st_gid) for name, st in modes.items()} == dict.fromkeys(modes, (0, 0))
    assert stat.S_IMODE(modes["bin/tool"].st_mode) == 0o755
    assert stat.S_IMODE(modes["conf.txt"].st_mode) == 0o644
    assert not stat.S_IMODE(modes["data"].st_mode) & (stat.S_ISVTX | stat.S_IWOTH)


@pytest.mark.parametrize(("name", "kind", "link"), [
    ("../escape.txt", tarfile.REGTYPE, ""),
    ("a/../../escape.txt", tarfile.REGTYPE, ""),
    ("/tmp/absolute.txt", tarfile.REGTYPE, ""),
    ("link", tarfile.SYMTYPE, "/etc"),
    ("inside-link", tarfile.SYMTYPE, "train.py"),
    ("hard", tarfile.LNKTYPE, "/etc/passwd"),
    ("fifo", tarfile.FIFOTYPE, ""),
    ("tty", tarfile.CHRTYPE, ""),
])
def test_members_that_are_links_devices_or_leave_the_workdir_are_refused(
        tmp_path: Path, filters: str, name: str, kind: bytes, link: str) -> None:
    root = tmp_path / "work"
    root.mkdir()
    message = refusal(run_unpack(root, tar_of(member(name, kind=kind, link=link)), filters))

    assert message.startswith(f"distrun: refusing '{name}': ") and message.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["work"]


def test_a_directory_that_is_a_link_out_of_the_workdir_is_not_written_through(tmp_path: Path, filters: str) -> None:
    root, outside = tmp_path / "work", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "sub").symlink_to(outside)

    assert refusal(run_unpack(root, tar_of(member("sub/x.py")), filters)).startswith("distrun: refusing")
    assert list(outside.iterdir()) == []


def test_a_file_written_over_a_hard_link_leaves_the_other_name_as_it_was(tmp_path: Path, filters: str) -> None:
    root, victim = tmp_path / "work", tmp_path / "victim.txt"
    root.mkdir()
    victim.write_text("keep\n")
    os.link(victim, root / "train.py")

    result = run_unpack(root, tar_of(member("train.py", b"new\n")), filters)

    assert result.returncode == 0, result.stderr.decode()
    assert (root / "train.py").read_text() == "new\n" and victim.read_text() == "keep\n"


RENAME_EXCHANGE = 2
AT_FDCWD = -100


def exchanger(a: Path, b: Path, stop: threading.Event) -> threading.Thread:
    """A thread that swaps two paths atomically (renameat2 RENAME_EXCHANGE) until `stop`."""
    libc = ctypes.CDLL(None, use_errno=True)

    def swap() -> None:
        while not stop.is_set():
            libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE)

    return threading.Thread(target=swap, daemon=True)


def test_a_directory_swapped_for_a_link_during_unpack_never_receives_a_write_outside(
        tmp_path: Path, filters: str) -> None:
    root, outside = tmp_path / "work", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (tmp_path / "swap").symlink_to(outside)
    tar = tar_of(*(member(f"sub/f{i}.py", b"print()\n" * 64) for i in range(150)))
    stop = threading.Event()
    thread = exchanger(root / "sub", tmp_path / "swap", stop)
    thread.start()
    try:
        result = run_unpack(root, tar, filters)
    finally:
        stop.set()
        thread.join()

    assert list(outside.iterdir()) == []
    # Whichever of the checks (the filter's, or opening `sub` with O_NOFOLLOW) saw the link first.
    assert result.returncode == 0 or refusal(result).startswith("distrun: refusing")
