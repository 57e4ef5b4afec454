"""What a failure makes every other process print, kept off the screen (the job's files keep it).

One rank raising takes the job down: its peers raise in their next collective, each torchrun
prints a ChildFailedError block with a "Root Cause" of its own, and the processes distrun stops
print SignalException tracebacks. On screen that is hundreds of lines and several contradicting
root causes, before distrun's own. `ShutdownFold` decides, line by line, what stays on screen:

- stdout always shows;
- the first rank whose stderr shows a traceback is the one on screen: all of its lines show,
  so its traceback is there once and whole;
- any other rank's tracebacks are folded, each from its `Traceback` line to its exception line
  (its latest folded lines are held, so that when the root cause turns out to be that rank,
  `release` shows them after all); its other lines show;
- a host's torchrun (no rank), from its first traceback, ChildFailedError or exit-barrier error
  on, is folded; so is everything torchrun and the ranks print on stderr once distrun is
  stopping the host (`stopping`), and distrun's own notes about that host from then on.

Folded lines are counted per host, for one line each: `[node0] 52 lines of shutdown output
(distrun logs ID --node node0)`.

`HarmlessFold` keeps known-harmless warnings that repeat (`HARMLESS`) to their first, counted, and
keeps off the screen altogether the ones every launch prints (`SILENT`: c10d's "hostname of the
client socket cannot be retrieved", which says only that a connecting host has no reverse DNS); the
job's files and `distrun logs` keep both, and neither is a rank's progress for the stall and hang
watchdog (`only_harmless`),
and folds c10d's TCPStore `recvValueWithTimeout` warning with the C++ stack under it (what a
host's torchrun prints when the store's host ended first, in the exit barrier of a job that
succeeded) into one line saying what it was: the launch's screen and `logs -f` fold them alike.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from orchestrator.logs.format import group_label

TRACEBACK = re.compile(r"^(?:\[rank\d+\]:\s*)?Traceback \(most recent call last\):", re.M)
RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch's excepthook prefixes each line of a rank's traceback
# Lines inside a traceback that are not its end: frames (indented), blank lines, chained exceptions.
CHAINED = ("During handling of the above exception", "The above exception was the direct cause", "Traceback (")
# What torchrun prints once a worker failed or while it is stopped: the start of a block to fold.
TORCHRUN_FAILING = ("ChildFailedError", "Error waiting on exit barrier", "SignalException",
                    "failed (exitcode:", "Sending process")
HELD_LINES = 200  # per folded rank: enough for a whole traceback should it be the root cause's
# Warnings known to be harmless and to repeat: shown once per job, then counted; never a rank's progress.
HARMLESS: tuple[str, ...] = ()
# Known-harmless warnings that every launch prints (torch's TCPStore server, for each host that connects
# from an address without reverse DNS): never on the screen, kept in the job's files; never progress.
SILENT = ("The hostname of the client socket cannot be retrieved",)
HARMLESS_BYTES = tuple(pattern.encode() for pattern in (*HARMLESS, *SILENT))
# torchrun's banner when OMP_NUM_THREADS is unset, four lines from every host: the first host's shows.
OMP_BANNER = re.compile(r"torch/distributed/run\.py:\d+\] (?:\*{5,}|Setting OMP_NUM_THREADS environment variable.*)?"
                        r"\s*$")
BANNER_WHAT = "lines of torchrun's OMP_NUM_THREADS banner"
# c10d's warning when the TCPStore's host went away, with its C++ stack (`Exception raised from`, `frame #N:`).
STORE_WARNING = "recvValueWithTimeout failed"
CPP_STACK = re.compile(r"^(?:Exception raised from |frame #\d+: |\s*$)")
STORE_FOLDED = ("distrun: c10d's TCPStore warning (recvValueWithTimeout: the store's host had ended, as at "
                "torchrun's exit barrier) and its C++ stack not shown; the job's files keep them\n")


def only_harmless(data: bytes) -> bool:
    """Whether every line of `data` is a known-harmless warning (`HARMLESS`): what distrun folds as
    harmless is no sign that a rank moves (c10d prints it while the ranks connect, before any step)."""
    if not any(pattern in data for pattern in HARMLESS_BYTES):
        return False
    return all(any(pattern in line for pattern in HARMLESS_BYTES) for line in data.splitlines() if line.strip())


@dataclass
class Folded:
    """What was kept off the screen for one reason: how many lines, from which hosts."""

    count: int = 0
    nodes: dict[str, None] = field(default_factory=dict)


class HarmlessFold:
    """Known-harmless output that repeats: the first of each warning shows and the others are
    counted; torchrun's OMP_NUM_THREADS banner shows from the first host that prints it."""

    def __init__(self) -> None:
        self.folded: dict[str, Folded] = {}  # what was folded, as the closing line says it -> counts
        self.banner_host: str | None = None
        self.in_stack: set[str] = set()  # hosts inside a folded TCPStore warning's C++ stack

    def take(self, node: str, text: str) -> str:
        """`text` (whole lines) without the repeats of known-harmless output."""
        if (not any(pattern in text for pattern in (*HARMLESS, *SILENT)) and "torch/distributed/run.py:" not in text
                and STORE_WARNING not in text and node not in self.in_stack):
            return text
        kept = []
        for line in [ln + "\n" for ln in text[:-1].split("\n")]:
            fresh = node not in self.in_stack
            if self._store_stack(node, line):
                if fresh:
                    kept.append(STORE_FOLDED)
                continue
            if any(pattern in line for pattern in SILENT):
                continue
            what = self._repeat(node, line)
            if what is None:
                kept.append(line)
            else:
                folded = self.folded.setdefault(what, Folded())
                folded.count += 1
                folded.nodes[node] = None
        return "".join(kept)

    def _store_stack(self, node: str, line: str) -> bool:
        """Whether `line` is c10d's TCPStore warning or a line of the C++ stack under it (folded)."""
        if STORE_WARNING in line:
            self.in_stack.add(node)
            return True
        if node in self.in_stack and CPP_STACK.match(line):
            return True
        self.in_stack.discard(node)
        return False

    def _repeat(self, node: str, line: str) -> str | None:
        """What `line` repeats (the closing line's words for it), or None when it shows."""
        if OMP_BANNER.search(line):
            self.banner_host = self.banner_host or node
            return None if node == self.banner_host else BANNER_WHAT
        pattern = next((p for p in HARMLESS if p in line), None)
        if pattern is None:
            return None
        what = f'"{pattern}" warning(s)'
        if what in self.folded:
            return what
        self.folded[what] = Folded()  # the first shows
        return None

    def said(self) -> list[str]:
        """One line for each kind of output whose repeats were kept off, labelled with its hosts as a
        line of theirs is (`[node0-2]`)."""
        return [f"{group_label(folded.nodes, [], 'o')} distrun: {folded.count} more {what} not shown "
                f"(known to be harmless; they are in the job's files)\n"
                for what, folded in self.folded.items() if folded.count]


class ShutdownFold:
    """Which stderr lines a failure's aftermath keeps off the screen, counted per host."""

    def __init__(self, held_lines: int = HELD_LINES) -> None:
        self.held_lines = held_lines
        self.shown: tuple[str, int] | None = None  # the rank whose traceback is on screen
        self.folding: set[str] = set()  # hosts whose torchrun output is folded from now on
        # Ranks whose traceback is being folded -> whether its exception line came (a chained one may follow).
        self.in_traceback: dict[tuple[str, int], bool] = {}
        self.stopping_hosts: set[str] = set()
        self.counts: dict[str, int] = {}  # host -> lines folded not yet said
        self.held: dict[tuple[str, int], deque[str]] = {}

    def take(self, node: str, rank: int | None, stream: str, text: str) -> str:
        """The part of `text` (whole lines) to show; the rest is folded."""
        if stream != "e" and rank is not None:
            return text
        if node in self.stopping_hosts or (rank is None and self._torchrun_folds(node, text)):
            self._fold(node, rank, text[:-1].split("\n"))
            return ""
        if rank is None or self.shown == (node, rank) or (
                (node, rank) not in self.in_traceback and not TRACEBACK.search(text)):
            return text
        shown = []
        for line in text[:-1].split("\n"):
            if self._in_folded_traceback(node, rank, line):
                self._fold(node, rank, [line])
            else:
                shown.append(line + "\n")
        return "".join(shown)

    def note(self, node: str) -> bool:
        """Whether distrun's own note about `node` folds: once distrun is stopping the host, its notes
        (stopping, the processes ended) are shutdown output too, counted with the rest."""
        if node not in self.stopping_hosts:
            return False
        self.counts[node] = self.counts.get(node, 0) + 1
        return True

    def stopping(self, node: str) -> None:
        """distrun began stopping `node`: fold all of its stderr from now on."""
        self.stopping_hosts.add(node)

    def release(self, node: str, rank: int | None) -> str:
        """The held lines of the root cause's rank, when they were folded (its traceback, whole)."""
        if rank is None or self.shown == (node, rank):
            return ""
        held = self.held.pop((node, rank), None)
        if not held:
            return ""
        self.counts[node] = max(self.counts.get(node, 0) - len(held), 0)
        return "".join(held)

    def said(self, node: str) -> int:
        """The lines folded for `node` since last said (then counted from zero)."""
        return self.counts.pop(node, 0)

    def pending(self) -> list[str]:
        """Hosts with folded lines not yet said."""
        return [node for node, count in self.counts.items() if count]

    def _fold(self, node: str, rank: int | None, lines: list[str]) -> None:
        self.counts[node] = self.counts.get(node, 0) + len(lines)
        if rank is not None:
            held = self.held.setdefault((node, rank), deque(maxlen=self.held_lines))
            held.extend(line + "\n" for line in lines)

    def _torchrun_folds(self, node: str, text: str) -> bool:
        """Whether torchrun's `text` is folded: from its first traceback or failure message on."""
        if node not in self.folding and (TRACEBACK.search(text) or any(m in text for m in TORCHRUN_FAILING)):
            self.folding.add(node)
        return node in self.folding

    def _in_folded_traceback(self, node: str, rank: int, line: str) -> bool:
        """Whether a rank's `line` belongs to a traceback that is folded (the first one is shown)."""
        key = (node, rank)
        if self.shown == key:
            return False
        if key not in self.in_traceback:
            if not TRACEBACK.match(line):
                return False
            if self.shown is None:
                self.shown = key
                return False
            self.in_traceback[key] = False
            return True
        text = RANK_PREFIX.sub("", line, count=1)
        inside = not text.strip() or text[0].isspace() or text.startswith(CHAINED)
        if self.in_traceback[key] and not inside:
            del self.in_traceback[key]  # the line after the exception line, and no chained exception
            return False
        self.in_traceback[key] = not inside  # the exception line ends it, unless a chained one follows
        return True
