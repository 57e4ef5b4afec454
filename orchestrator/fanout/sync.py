"""`sync: true`: copy the job's local directory to each host's workdir before launch.

The job's local directory is the controller's current directory (where relative `script`
paths resolve). Which of its files are sent is decided once, before any host is written to:

1. Listing. In a git work tree (when git is installed): what `git ls-files --cached --others
   --exclude-standard` lists, i.e. tracked files and the untracked files that no `.gitignore`,
   `.git/info/exclude` or global excludes file ignores. Elsewhere: every file, less what the
   `.gitignore` files (in the directory and below) ignore, read with git's rules (`#`, `!`,
   a trailing `/` for directories, a `/` at the start or in the middle anchors to the file's
   directory, `*`, `?`, `[...]`, `**`).
2. distrun's own rules, gitignore syntax, later lines winning: DEFAULT_IGNORES (environments
   and caches), SECRET_PATTERNS (keys and credentials), then the `.distrunignore` file of the
   directory. A `!pattern` line there sends what a default skips (`!.env.example`).
3. Regular files only: symbolic links and special files are never sent.

Files skipped as secret-looking are named in one line on stderr, with how to send them. When
the files to send add up to more than the job's `sync_max_size`, the launch stops (exit 2)
before anything is sent.

Each host reports a sha256 manifest of its workdir; only the files that differ travel, as
one tar streamed over the command's stdin a block at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator import remote
from orchestrator.console.display import size_text
from orchestrator.console.terminal import show
from orchestrator.errors import InfraError, UsageError
from orchestrator.fanout.group import Group
from orchestrator.plan import LaunchPlan
from orchestrator.transport import RemoteProcess, Transport, run_remote

IGNORE_FILE = ".distrunignore"
GITIGNORE = ".gitignore"
DEFAULT_IGNORES = (".venv/", "venv/", "__pycache__/", "*.pyc", ".pytest_cache/", ".ruff_cache/", ".mypy_cache/",
                   ".hypothesis/", "*.egg-info/", ".distrun/")
# ssh-keygen's names rather than `id_*`, so that `id_utils.py` is still sent.
SECRET_PATTERNS = (".git/", ".env*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx",
                   "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", ".pgpass", ".git-credentials",
                   ".pypirc", ".npmrc", ".htpasswd", ".ssh/", ".aws/", ".gnupg/", ".kube/")
SYNC_TIMEOUT = 600.0
BLOCK = 1 << 20
SHOWN_SKIPPED = 5


@dataclass(frozen=True)
class Rule:
    """One gitignore-style line, compiled: `regex` matches a relative path it applies to."""

    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    secret: bool = False


@dataclass(frozen=True)
class LocalFile:
    digest: str
    size: int


@dataclass
class Selection:
    """What sync sends: {relative path: file}, and the secret-looking paths it skipped."""

    files: dict[str, LocalFile]
    secrets: list[str]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


# ---------------------------------------------------------------- gitignore-style rules


def glob_regex(glob: str) -> str:
    """A gitignore glob as a regex: `*` and `?` stop at `/`, `**` crosses it, `[...]` kept."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            body = glob[i + 1:end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end + 1
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_rule(line: str, base: str = "", secret: bool = False) -> Rule | None:
    """Compile one line of a gitignore-style file kept in directory `base` (relative, '' = top).

    Returns:
        The rule, or None for a blank line or a comment.
    """
    if not line.endswith("\\ "):
        line = line.rstrip(" ")
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    line = line[1:] if negate else line
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    prefix = re.escape(base + "/") if base else ""
    pattern = glob_regex(line.lstrip("/"))
    regex = f"{prefix}{pattern}" if anchored else f"{prefix}(?:.*/)?{pattern}"
    return Rule(re.compile(regex + r"\Z", re.DOTALL), negate, dir_only, secret)


def read_rules(path: Path, base: str) -> list[Rule]:
    """The rules of one ignore file; none when it does not exist or cannot be read."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [rule for line in lines if (rule := parse_rule(line, base)) is not None]


def decision(rules: list[Rule], rel: str, is_dir: bool) -> Rule | None:
    """The last rule that matches `rel`; it excludes the path unless it is a negation."""
    found = None
    for rule in rules:
        if (is_dir or not rule.dir_only) and rule.regex.match(rel):
            found = rule
    return found


def distrun_rules(root: Path) -> list[Rule]:
    """DEFAULT_IGNORES, SECRET_PATTERNS, then the directory's .distrunignore."""
    defaults = [parse_rule(p) for p in DEFAULT_IGNORES] + [parse_rule(p, secret=True) for p in SECRET_PATTERNS]
    return [rule for rule in defaults if rule is not None] + read_rules(root / IGNORE_FILE, "")


# ---------------------------------------------------------------- choosing the files


def git_listing(root: Path) -> list[str] | None:
    """The files git would have in a commit of `root` (tracked, or untracked and not ignored);
    None when `root` is not in a git work tree, git is not installed, or git lists nothing
    (`root` is itself ignored, e.g. an experiments directory its repository leaves out)."""
    argv = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        result = subprocess.run(argv, capture_output=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    listed = sorted({name for name in result.stdout.decode("utf-8", "surrogateescape").split("\0") if name})
    return listed or None


def walk_listing(root: Path, excluded_dir: ExcludedDir) -> list[str]:
    """Every file below `root` that its .gitignore files do not ignore. A directory that
    distrun's rules exclude is not entered: it is listed once, as `name/`."""
    rules: list[Rule] = []
    found: list[str] = []
    for base, dirs, files in os.walk(root):
        rel_base = os.path.relpath(base, root)
        rel_base = "" if rel_base == "." else rel_base
        rules += read_rules(Path(base) / GITIGNORE, rel_base)
        kept = []
        for name in sorted(dirs):
            rel = f"{rel_base}/{name}" if rel_base else name
            if excluded(decision(rules, rel, True)):
                continue
            if excluded_dir(rel):
                found.append(rel + "/")
            else:
                kept.append(name)
        dirs[:] = kept
        found += [rel for rel in (f"{rel_base}/{n}" if rel_base else n for n in sorted(files))
                  if not excluded(decision(rules, rel, False))]
    return found


def excluded(rule: Rule | None) -> bool:
    return rule is not None and not rule.negate


class ExcludedDir:
    """Whether a directory is excluded by distrun's rules, itself or through a parent (memoised)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.seen: dict[str, Rule | None] = {}

    def __call__(self, rel: str) -> Rule | None:
        """The rule that excludes directory `rel` or one of its parents, or None."""
        if rel not in self.seen:
            parent = rel.rpartition("/")[0]
            by_parent = self(parent) if parent else None
            own = decision(self.rules, rel, True)
            self.seen[rel] = by_parent or (own if excluded(own) else None)
        return self.seen[rel]


def select_files(root: Path) -> Selection:
    """What sync sends from `root` (see the module's docstring).

    Returns:
        The files to send, with their sha256 and size, and the secret-looking paths skipped.
    """
    rules = distrun_rules(root)
    excluded_dir = ExcludedDir(rules)
    listed = git_listing(root)
    if listed is None:
        listed = walk_listing(root, excluded_dir)
    files: dict[str, LocalFile] = {}
    secrets: dict[str, None] = {}
    for rel in listed:
        parent = rel.rstrip("/").rpartition("/")[0]
        rule = (excluded_dir(parent) if parent else None) or decision(rules, rel.rstrip("/"), rel.endswith("/"))
        if excluded(rule):
            if rule is not None and rule.secret:
                secrets[_skipped_name(rule, rel)] = None
            continue
        local = None if rel.endswith("/") else local_file(root / rel)
        if local is not None:
            files[rel] = local
    return Selection(files, sorted(secrets))


def _skipped_name(rule: Rule, rel: str) -> str:
    """A skipped file, or the directory a rule skipped it with (`.ssh/`)."""
    parts = rel.split("/")
    for end in range(1, len(parts)):
        if rule.regex.match("/".join(parts[:end])):
            return "/".join(parts[:end]) + "/"
    return rel


def local_file(path: Path) -> LocalFile | None:
    """sha256 and size of a regular file, read a block at a time; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # a link, or gone since the listing
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        digest = hashlib.sha256()
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return LocalFile(digest.hexdigest(), info.st_size)


def check_size(selection: Selection, root: Path, limit: int, job_file: str) -> None:
    """Refuse to send more than `limit` bytes.

    Raises:
        UsageError: the files add up to more; names the largest ones.
    """
    if selection.size <= limit:
        return
    largest = sorted(selection.files.items(), key=lambda item: -item[1].size)[:3]
    names = ", ".join(f"{name} {size_text(f.size)}" for name, f in largest)
    raise UsageError(f"sync: {root} has {size_text(selection.size)} to send, over the limit of {size_text(limit)} "
                     f"(largest: {names}); list what the job does not need in {IGNORE_FILE}, "
                     f"or raise sync_max_size in {job_file}")


def skipped_line(secrets: list[str]) -> str:
    """The one line that says which secret-looking files are not sent, and how to send one."""
    shown = ", ".join(secrets[:SHOWN_SKIPPED])
    more = f" and {len(secrets) - SHOWN_SKIPPED} more" if len(secrets) > SHOWN_SKIPPED else ""
    example = secrets[0].rstrip("/")
    return (f"distrun: sync: not sending {len(secrets)} secret-looking file(s): {shown}{more} "
            f"(to send one, add a line like '!{example}' to {IGNORE_FILE})")


# ---------------------------------------------------------------- sending


class _Stdin:
    """The file object tarfile writes to: a remote command's stdin."""

    def __init__(self, proc: RemoteProcess) -> None:
        self.proc = proc

    def write(self, data: bytes) -> int:
        self.proc.write(data)
        return len(data)


def send_tar(transport: Transport, root: Path, workdir: str, names: list[str]) -> None:
    """Stream `names` (relative to `root`) as a tar to the host's unpack, a block at a time.

    Raises:
        InfraError: the host's unpack failed or did not finish within SYNC_TIMEOUT.
    """
    payload = remote.bundle("unpack", ["unpack"])
    proc = transport.start(remote.bootstrap_argv(transport.node.python, payload, workdir, "unpack"))
    errors: list[str] = []
    proc.stream(lambda _line: None, errors.append)
    try:
        proc.write(payload)
        write_tar(proc, root, names)
    except BaseException:
        proc.terminate()  # a file vanished or shrank while it was read: the host need not wait for more
        raise
    proc.close_stdin()
    rc = proc.wait(SYNC_TIMEOUT)
    if rc != 0:
        last = (errors or ["timed out" if rc is None else "no output"])[-1]
        raise InfraError(f"{transport.name}: unpack failed (exit code {rc}) using python "
                         f"'{transport.node.python}': {last}")


def write_tar(proc: RemoteProcess, root: Path, names: list[str]) -> None:
    """Write the tar of `names` to the command's stdin, with no owner of this machine in it."""
    with tarfile.open(fileobj=_Stdin(proc), mode="w|", bufsize=BLOCK, format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            with open(root / name, "rb", opener=_no_follow) as fh:
                info = tar.gettarinfo(arcname=name, fileobj=fh)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, fh)


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def sync_host(transport: Transport, root: Path, workdir: str, wanted: dict[str, LocalFile]) -> int:
    """Bring one host's workdir up to date; returns how many files were sent."""
    remote_files = json.loads(run_remote(transport, "unpack", ["unpack"], b"", workdir, "manifest",
                                         timeout=SYNC_TIMEOUT).strip().splitlines()[-1])
    changed = sorted(name for name, local in wanted.items() if remote_files.get(name) != local.digest)
    if changed:
        send_tar(transport, root, workdir, changed)
    return len(changed)


def sync_workdirs(plan: LaunchPlan, group: Group, root: Path) -> dict[str, int]:
    """Sync every host at once.

    Returns:
        {node: files sent}.

    Raises:
        UsageError: the files to send add up to more than the job's sync_max_size (nothing sent).
        GroupError: a host could not be synced (each one named).
    """
    selection = select_files(root)
    check_size(selection, root, plan.sync_max_size, plan.spec_path)
    if selection.secrets:
        show(skipped_line(selection.secrets), err=True)
    wanted = selection.files
    hosts = {h.node: h.workdir for h in plan.hosts}
    return group.run(lambda t: sync_host(t, root, hosts[t.name], wanted)).check("workdir sync failed")
