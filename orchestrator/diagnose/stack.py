"""Every rank's Python stack, gathered from every host at once and folded as `clush -b` folds output.

`gather` has the job's backend run remote/stack.py beside the ranks of each host (py-spy there);
`fold` groups ranks whose stacks are the same once addresses are ignored, the odd ones out
first. Ranks are compared by one thread each (`RankStack.focus`: the thread in torch.distributed,
the main thread first, else the main thread): a logger or TensorBoard thread that one rank runs
and the others do not makes no rank odd; `render` and `to_json` show the groups. The hang watchdog
(watchdog.py) keeps the same text in the job directory (stacks/) and names the odd group in its failure.
What reaches the hosts is `ReachesRanks`, which every backend that can run a program beside a job's
ranks is.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator import remote
from orchestrator.console.display import rank_ranges
from orchestrator.errors import InfraError, UsageError, one_line
from orchestrator.remote.flightrec import not_a_record
from orchestrator.remote.flightrec import one_line as flight_one_line
from orchestrator.remote.redact import Masker

if TYPE_CHECKING:
    from orchestrator.fanout.group import GroupResult
    from orchestrator.store import JobRecord

# What `stack` runs on a host, dependencies first: it finds the ranks as the supervisor does.
STACK_MODULES = [*remote.SUPERVISOR_IMPORTS, "supervisor", "pyspy", "stack"]
# A dump of every rank of a host takes well under this; py-spy itself gives up on a rank after 20 s.
GATHER_TIMEOUT = 40.0
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
# Frames of the interpreter, installed packages and native libraries (--native): the user's code is the rest.
LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3[.\d]*/|^<|\.so(\.[\d.]+)?$")
MAIN_THREAD = "MainThread"
IMPORTLIB = "<frozen importlib"  # the import machinery's frames, as py-spy names their file
ENTRY_FILE = "/" + remote.WORKER_PROGRAM
COLLECTIVE = re.compile(r"torch/distributed/")


class ReachesRanks(Protocol):
    """What diagnosis needs of a job's backend: a remote program run beside the ranks of some hosts
    (orchestrator.backends.base.Backend.run_remote_near, which every backend has)."""

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]: ...


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: function, file (as py-spy shortens it), line."""

    name: str
    file: str
    line: int
    library: bool = False  # in the interpreter or an installed package, not the user's code

    def text(self) -> str:
        """`all_reduce (torch/distributed/distributed_c10d.py:2806)`."""
        return f"{self.name} ({self.file}:{self.line})" if self.line else f"{self.name} ({self.file})"


@dataclass(frozen=True)
class Thread:
    """One Python thread of a rank, its frames innermost first."""

    name: str
    frames: tuple[Frame, ...]

    def key(self) -> tuple[str, tuple[tuple[str, str, int], ...]]:
        """What two ranks' threads must share to be folded: names, files and lines, addresses ignored."""
        return self.name, tuple((ADDRESS.sub("0x?", f.name), ADDRESS.sub("0x?", f.file), f.line)
                                for f in self.frames)


@dataclass(frozen=True)
class RankStack:
    """One rank's dump: its threads, or why there is none."""

    node: str
    rank: int
    pid: int
    threads: tuple[Thread, ...] = ()
    error: str = ""

    def key(self) -> tuple[Any, ...]:
        """What two ranks must share to be in one group: the focus thread (other threads ignored)."""
        if self.error:
            return ("error", ADDRESS.sub("0x?", self.error))
        focus = self.focus()
        return () if focus is None else focus.key()

    def in_collective(self) -> bool:
        """Whether the focus thread is inside torch.distributed (a collective, a barrier, a store wait)."""
        thread = self.focus()
        return thread is not None and in_torch_distributed(thread)

    def main_thread(self) -> Thread | None:
        named = [t for t in self.threads if t.name == MAIN_THREAD]
        return named[0] if named else (self.threads[0] if self.threads else None)

    def focus(self) -> Thread | None:
        """The thread that says where the rank is: the main thread if it is in torch.distributed, else
        a thread that is (a program that trains in a thread of its own), else the main thread."""
        main = self.main_thread()
        if main is None or in_torch_distributed(main):
            return main
        return next((t for t in self.threads if in_torch_distributed(t)), main)

    def where(self) -> str:
        """A few words for where the rank is: `all_reduce ← main (worker.py:50)`; the error if no dump."""
        if self.error:
            return self.error
        thread = self.focus()
        if thread is None or not thread.frames:
            return "no Python frames"
        inner = thread.frames[0]
        own = next((f for f in thread.frames if not f.library), None)
        if own is None or own is inner:
            return inner.text()
        return f"{inner.name} ← {own.text()}"


def in_torch_distributed(thread: Thread) -> bool:
    return any(COLLECTIVE.search(f.file) for f in thread.frames)


@dataclass
class StackGroup:
    """Ranks with the same stack: one of them stands for all."""

    ranks: list[RankStack] = field(default_factory=list)

    @property
    def sample(self) -> RankStack:
        return self.ranks[0]

    def label(self) -> str:
        """`ranks 0-2,4-5` or `rank 3`."""
        numbers = [r.rank for r in self.ranks]
        return f"{'rank' if len(numbers) == 1 else 'ranks'} {rank_ranges(numbers)}"

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(r.node for r in self.ranks))


@dataclass
class Flight:
    """The ranks' Flight Recorder dumps (`gather(flight=True)`): rank -> fr_trace_json's JSON, rank ->
    why it gave none, each rank's node, and the longest a rank took to fetch its dump."""

    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    nodes: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def add_host(self, node: str, stdout: str) -> None:
        """The dumps in one host's answer (remote/stack.py's JSON line; nothing when it is not JSON). A
        rank's answer that is not a record distrun can read is kept as why it gave none, one line."""
        try:
            data = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return
        for entry in data.get("ranks", []):
            rank = int(entry["rank"])
            self.nodes[rank] = node
            if "flight" in entry:
                why = not_a_record(entry["flight"])
                if why is None:
                    self.dumps[rank] = entry["flight"]
                else:
                    self.errors[rank] = f"the answer is not a record: {why}"
            elif entry.get("flight_error"):
                self.errors[rank] = flight_one_line(str(entry["flight_error"]))
            self.seconds = max(self.seconds, float(entry.get("flight_seconds") or 0.0))


@dataclass
class Gathered:
    """What `gather` found: every rank's stack, and the hosts that gave none (host -> why)."""

    ranks: list[RankStack]
    failed: dict[str, str]
    seconds: float
    flight: Flight = field(default_factory=Flight)


def parse_frame(data: dict[str, Any]) -> Frame:
    filename = str(data.get("filename") or "")
    return Frame(name=str(data.get("name") or "?"), file=str(data.get("short_filename") or filename or "?"),
                 line=int(data.get("line") or 0), library=bool(LIBRARY.search(filename)) or not filename)


def own_frames(frames: list[dict[str, Any]]) -> tuple[Frame, ...]:
    """A thread's frames as under plain torchrun: those of distrun's worker entry, which runs the
    script (remote/distrun_worker.py), left out."""
    return tuple(parse_frame(f) for f in frames if not str(f.get("filename") or "").endswith(ENTRY_FILE))


def thread_name(data: dict[str, Any], pid: int) -> str:
    """A thread's name, never its id (ids differ between ranks that are in the same place): the
    process's first thread is the main thread even where `threading` was never imported."""
    if data.get("thread_name"):
        return str(data["thread_name"])
    return MAIN_THREAD if data.get("os_thread_id") == pid else "unnamed"


def parse_host(node: str, stdout: str) -> list[RankStack]:
    """The ranks of one host from remote/stack.py's JSON line.

    Raises:
        InfraError: the host found ranks but has no py-spy, or its answer is not JSON.
    """
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise InfraError(f"{node}: the stack dump printed no JSON") from exc
    if data.get("pyspy") is None and data.get("ranks"):
        raise InfraError(f"{node}: py-spy is not installed beside the host's python nor on its PATH "
                         "(pip install py-spy in the environment that runs the job)")
    stacks = []
    for entry in data.get("ranks", []):
        threads = tuple(Thread(thread_name(t, int(entry["pid"])), own_frames(t.get("frames", [])))
                        for t in entry.get("threads", []))
        stacks.append(RankStack(node, int(entry["rank"]), int(entry["pid"]), threads, str(entry.get("error", ""))))
    return stacks


def masked_answer(stdout: str, masker: Masker) -> str:
    """A host's answer with every secret masked in each string of its JSON line (a secret a frame
    name or a Flight Recorder dump carries; JSON escapes would hide it from a mask of the raw text)."""
    if not masker:
        return stdout
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return masker.text(stdout)
    return json.dumps(_masked(data, masker))


def _masked(value: Any, masker: Masker) -> Any:
    if isinstance(value, str):
        return masker.text(value)
    if isinstance(value, list):
        return [_masked(item, masker) for item in value]
    if isinstance(value, dict):
        return {masker.text(str(k)): _masked(v, masker) for k, v in value.items()}
    return value


def gather(backend: ReachesRanks, record: JobRecord, nodes: Sequence[str] | None = None, native: bool = False,
           timeout: float = GATHER_TIMEOUT, flight: bool = False, masker: Masker | None = None) -> Gathered:
    """Dump every rank of a job on its hosts (or on `nodes`), all hosts at once.

    Args:
        backend: The backend the job runs on (it reaches the ranks' hosts).
        record: The job.
        nodes: Only these of its hosts; None: all.
        native: Include native (C/C++) frames (py-spy --native).
        timeout: Seconds a host may take.
        flight: Also fetch each rank's Flight Recorder dump (ranks that serve one: orchestrator/diagnose/flight.py).
        masker: The job's secrets, masked in everything the hosts answered.

    Returns:
        Every rank's stack in rank order, the hosts that gave none with why, and the dumps.

    Raises:
        UsageError: a node is not the job's, or its backend cannot reach its ranks.
    """
    wanted = list(nodes) if nodes else list(record.hosts)
    unknown = [n for n in wanted if n not in record.hosts]
    if unknown:
        raise UsageError(f"--node {unknown[0]}: job {record.id} ran on {', '.join(record.hosts)}")
    started = time.monotonic()
    args = ["--native"] * native + ["--flight"] * flight
    results = backend.run_remote_near(record, wanted, "stack", STACK_MODULES, args,
                                      timeout)
    ranks: list[RankStack] = []
    dumps = Flight()
    failed = {node: one_line(exc) for node, exc in results.failed.items()}
    for node, answer in results.succeeded.items():
        stdout = masked_answer(answer, masker or Masker(()))
        dumps.add_host(node, stdout)
        try:
            ranks += parse_host(node, stdout)
        except InfraError as exc:
            failed[node] = str(exc)
    return Gathered(sorted(ranks, key=lambda r: r.rank), failed, time.monotonic() - started, dumps)


def fold(ranks: Sequence[RankStack]) -> list[StackGroup]:
    """Ranks grouped by stack, the smallest groups (the odd ones out) first. Among groups of the
    same size, one outside torch.distributed comes first: with two ranks, the one that is not
    waiting in a collective is the one the other waits for. Then by first rank."""
    groups: dict[Any, StackGroup] = {}
    for stack in sorted(ranks, key=lambda r: r.rank):
        groups.setdefault(stack.key(), StackGroup()).ranks.append(stack)
    return sorted(groups.values(), key=lambda g: (len(g.ranks), g.sample.in_collective(), g.ranks[0].rank))


def render(gathered: Gathered) -> str:
    """Every group's ranks and hosts, then its stack (main thread first, innermost frame first)."""
    groups = fold(gathered.ranks)
    lines: list[str] = []
    for group in groups:
        title = f"{group.label()} (on {', '.join(group.hosts())})"
        lines += ["-" * len(title), title, "-" * len(title)]
        lines += stack_lines(group.sample)
    for node, why in gathered.failed.items():
        lines.append(f"{node}: no stacks: {why}")
    if not gathered.ranks and not gathered.failed:
        lines.append("no ranks of this job are running")
    return "\n".join(lines)


def stack_lines(stack: RankStack) -> list[str]:
    """A rank's threads, main thread first, each frame on its line (innermost first)."""
    if stack.error:
        return [f"  {stack.error}"]
    main = stack.main_thread()
    ordered = [t for t in stack.threads if t is main] + [t for t in stack.threads if t is not main]
    lines: list[str] = []
    for thread in ordered:
        lines.append(f"  thread {thread.name}:")
        lines += [f"    {text}" for text in frame_texts(thread.frames)]
    return lines


def frame_texts(frames: Sequence[Frame]) -> list[str]:
    """Each frame's text, a run of the import machinery's frames (`<frozen importlib._bootstrap>`:
    a rank still importing, at start-up, shows dozens) folded into one line."""
    texts: list[str] = []
    for frozen, group in groupby(frames, key=lambda frame: frame.file.startswith(IMPORTLIB)):
        run = list(group)
        if frozen and len(run) > 1:
            texts.append(f"... {len(run)} importlib frames ({run[0].file}, ...)")
        else:
            texts += [frame.text() for frame in run]
    return texts


def to_json(gathered: Gathered) -> dict[str, Any]:
    """The groups as `distrun stack --json` prints them (documented in docs/commands.md)."""
    return {
        "groups": [{
            "ranks": [r.rank for r in g.ranks], "hosts": g.hosts(), "where": g.sample.where(),
            "error": g.sample.error or None,
            "threads": [{"name": t.name, "frames": [{"name": f.name, "file": f.file, "line": f.line} for f in t.frames]}
                        for t in g.sample.threads],
        } for g in fold(gathered.ranks)],
        "failed": gathered.failed,
        "seconds": round(gathered.seconds, 3),
    }
