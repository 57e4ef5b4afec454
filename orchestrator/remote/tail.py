"""Tails the files torchrun writes each rank's stdout and stderr to, and cuts them into whole lines.

torchrun started with `--redirects 3 --log-dir DIR` gives every worker its own two files,
`DIR/<run>/attempt_<restart>/<local rank>/stdout.log` and `stderr.log`, and no `--tee`: a rank
writes to its own file, so no two ranks' half lines can meet, and nothing reads those files
line by line inside torchrun. The supervisor's `Tailer` reads what was added to every file a
few hundred times a second while lines flow (fifty, then ten when quiet) and hands on whole lines
only; a line still without its newline waits for it, at most PARTIAL_WAIT seconds, and is then
handed on marked partial (as is what is left when the job ends). A line longer than LINE_MAX
is handed on in parts, masked across each cut: the part is masked whole, and its last bytes (one
fewer than the longest secret) wait for the next part, so no secret is ever split in two.

Order: within one read of a rank's two files, the file written last goes last (its mtime), so
a line printed just before a traceback comes before it; across reads, lines keep the order in
which they were read. Stdlib-only (runs on the hosts).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.remote.follow import Follower
from orchestrator.remote.redact import Masker

PARTIAL_WAIT = 0.5
READ_MAX = 256 << 10
LINE_MAX = 1 << 20  # a line longer than this without a newline is handed on in parts, marked partial
RESCAN = 0.25  # seconds between two looks for new rank files
STREAM_FILES = {"stdout.log": "o", "stderr.log": "e"}
_ATTEMPT = re.compile(r"^attempt_(\d+)$")

# emit(restart, local_rank, stream, data, nlines, partial)
Emit = Callable[[int, int, str, bytes, int, bool], None]


@dataclass
class RankFile:
    """One stream file of one worker, followed."""

    restart: int
    local_rank: int
    stream: str
    follower: Follower
    since: float = 0.0  # when the pending partial line began waiting


class Tailer:
    """Finds torchrun's rank files under `log_dir` and reads them as they grow.

    Args:
        log_dir: torchrun's `--log-dir`.
        emit: Called with each batch of whole lines (or one partial line) of a file.
        clock: Monotonic seconds (tests pass their own).
        masker: The job's secrets, masked across the cuts of a line longer than LINE_MAX.
    """

    def __init__(self, log_dir: str, emit: Emit, clock: Callable[[], float] = time.monotonic,
                 masker: Masker | None = None) -> None:
        self.log_dir = log_dir
        self.emit = emit
        self.clock = clock
        self.masker = masker or Masker(())
        self.overlap = max((len(s) for s in self.masker.raw), default=1) - 1
        self.files: dict[str, RankFile] = {}
        self.next_scan = 0.0

    def discover(self) -> None:
        """Open every rank file that appeared since the last look."""
        for path, restart, local_rank, stream in rank_files(self.log_dir):
            if path not in self.files:
                self.files[path] = RankFile(restart, local_rank, stream, Follower(path))

    def sweep(self, rescan: bool = False) -> bool:
        """Read what every file gained and hand on its whole lines, and the partial lines that
        waited PARTIAL_WAIT seconds; `rescan`: look for new files now.

        Returns:
            Whether anything was read.
        """
        now = self.clock()
        if rescan or now >= self.next_scan:
            self.discover()
            self.next_scan = now + RESCAN
        read = []
        for order, rank_file in enumerate(self.files.values()):
            data = rank_file.follower.read(READ_MAX)
            if data:
                read.append((rank_file.follower.mtime(), rank_file.stream != "o", order, rank_file, data))
        # Stream files written last go last: stdout's line before stderr's traceback.
        read.sort(key=lambda item: item[:3])
        for _, _, _, rank_file, data in read:
            self._cut(rank_file, data, now)
        for rank_file in self.files.values():
            if rank_file.follower.pending and now - rank_file.since >= PARTIAL_WAIT:
                self._partial(rank_file)
        return bool(read)

    def drain(self) -> None:
        """Read every file to its end and hand on what is left, partial lines included (the
        job ended)."""
        while self.sweep(rescan=True):
            pass
        for rank_file in self.files.values():
            if rank_file.follower.pending:
                self._partial(rank_file)

    def close(self) -> None:
        for rank_file in self.files.values():
            rank_file.follower.close()
        self.files.clear()

    def _cut(self, rank_file: RankFile, data: bytes, now: float) -> None:
        follower = rank_file.follower
        waiting = bool(follower.pending)
        whole = follower.cut(data)
        if whole:
            self.emit(rank_file.restart, rank_file.local_rank, rank_file.stream, whole, whole.count(b"\n"), False)
        if follower.pending and (not waiting or whole):
            rank_file.since = now
        if len(follower.pending) > LINE_MAX:
            self._long_part(rank_file)

    def _long_part(self, rank_file: RankFile) -> None:
        """Hand on a part of a line too long to wait for its end, masked; keep its last bytes (where
        a secret may begin that the next part ends) for the next part."""
        masked = self.masker.bytes(rank_file.follower.take_pending())
        cut = len(masked) - self.overlap
        rank_file.follower.pending = masked[cut:]
        self.emit(rank_file.restart, rank_file.local_rank, rank_file.stream, masked[:cut] + b"\n", 1, True)

    def _partial(self, rank_file: RankFile) -> None:
        self.emit(rank_file.restart, rank_file.local_rank, rank_file.stream, rank_file.follower.take_pending() + b"\n",
                  1, True)


def restart_count(log_dir: str) -> int:
    """How many times torchrun restarted its workers, by its own count: its agent starts each
    worker group in `attempt_<restart count>` (the workers' TORCHELASTIC_RESTART_COUNT, which only
    a failure's restart raises, not a change of membership), so the highest such directory is the
    count; 0 when there is none."""
    found = [int(match.group(1)) for run in _subdirs(log_dir) for attempt in _subdirs(run)
             if (match := _ATTEMPT.match(os.path.basename(attempt))) is not None]
    return max(found, default=0)


def rank_files(log_dir: str) -> list[tuple[str, int, int, str]]:
    """(path, restart, local rank, stream) of every rank file torchrun made under `log_dir`."""
    found = []
    for run in _subdirs(log_dir):
        for attempt in _subdirs(run):
            match = _ATTEMPT.match(os.path.basename(attempt))
            if match is None:
                continue
            for rank_dir in _subdirs(attempt):
                name = os.path.basename(rank_dir)
                if not name.isdigit():
                    continue
                for file_name, stream in STREAM_FILES.items():
                    path = os.path.join(rank_dir, file_name)
                    if os.path.exists(path):
                        found.append((path, int(match.group(1)), int(name), stream))
    return found


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(entry.path for entry in os.scandir(path) if entry.is_dir())
    except OSError:
        return []
