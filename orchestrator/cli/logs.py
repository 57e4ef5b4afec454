"""`distrun logs`: a job's lines, filtered, in one format; `-f` follows the job to its end and exits
with its exit code; `--recover` first rebuilds the job's files from its hosts' copies."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from orchestrator.cli.timespec import parse_since
from orchestrator.console.display import fold_hosts
from orchestrator.console.terminal import show
from orchestrator.errors import ExitCode, UsageError
from orchestrator.logs.format import note, ranges
from orchestrator.logs.query import (
    JobLog,
    Query,
    Renderer,
    Style,
    parse_ranks,
    read_lines,
    split_lines,
)
from orchestrator.remote.linestore import Located
from orchestrator.remote.redact import escape_controls
from orchestrator.run.ft.state import group_job_id
from orchestrator.run.recorded import for_record, refresh_lost
from orchestrator.store import JobDir, JobRecord, JobState, Store

FOLLOW_POLL = 0.2


@dataclass(frozen=True)
class LogsRequest:
    """What `distrun logs` was asked (the command line's values, not yet checked)."""

    job_ref: str
    follow: bool = False
    nodes: tuple[str, ...] = ()
    ranks: tuple[str, ...] = ()
    grep: str | None = None
    since: str | None = None
    tail: int | None = None
    stderr: bool = False
    attempt: int | None = None
    collapse: bool = False
    timestamps: bool = False
    bare: bool = False
    recover: bool = False
    group: int | None = None


def show_logs(request: LogsRequest, out: TextIO | None = None) -> int:
    """Print a job's lines as asked.

    Returns:
        0, or with `follow` the job's exit code once it ended.

    Raises:
        UsageError: an unknown job, a filter naming what the job does not have, a bad --grep or
            --since, or --recover on a job that still runs.
    """
    out = out or sys.stdout
    store = Store()
    record = store.get(request.job_ref)
    if request.group is not None:
        record = store.get(group_job_id(store, record.id, request.group))
    refresh_lost(store, [record])
    if request.recover:
        recover(store, record)
    job_dir = store.job_dir(record.id)
    query = build_query(request, record, job_dir)
    style = Style(request.timestamps, request.bare)
    try:
        if request.follow:
            return follow(store, record, query, style, request.collapse, out)
        shown = False
        for chunk in read_lines(job_dir.root, query, style, request.collapse):
            show(chunk, stream=out, end="")
            shown = shown or bool(chunk)
        if not shown and query.narrowed:
            show(f"no line of job {record.id} matches {' '.join(filter_words(request))}", err=True)
        if not query.narrowed and query.tail is None:
            show(summary_text(job_dir), stream=out, end="")
        out.flush()
    except BrokenPipeError:
        # The reader left (`| head`): nothing more to say, and nothing to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return int(ExitCode.OK)


def build_query(request: LogsRequest, record: JobRecord, job_dir: JobDir) -> Query:
    """The request's filters, each checked against what the job has.

    Raises:
        UsageError: a node, rank or attempt the job does not have; a bad --grep or --since.
    """
    nodes = frozenset(n.strip() for value in request.nodes for n in value.split(",") if n.strip()) or None
    for node in sorted(nodes or ()):
        if node not in record.every_host:
            raise UsageError(f"--node {node}: job {record.id} ran on {fold_hosts(record.every_host) or 'no host yet'}")
    ranks = parse_ranks(request.ranks)
    log = JobLog(job_dir.root)
    try:
        entries = log.new_entries()
    finally:
        log.close()
    if ranks is not None:
        known = known_ranks(job_dir, entries)
        for rank in sorted(ranks - known):
            have = f"ranks {ranges(f'r{r}' for r in sorted(known))[1:]}" if known else "no ranks yet"
            raise UsageError(f"--rank {rank}: job {record.id} has {have}")
    if request.attempt is not None and not request.follow:
        attempts = sorted({e.entry.attempt for e in entries}) or [1]
        if request.attempt not in attempts:
            raise UsageError(f"--attempt {request.attempt}: job {record.id} has attempt(s) "
                             f"{', '.join(map(str, attempts))}")
    try:
        grep = re.compile(request.grep) if request.grep is not None else None
    except re.error as exc:
        raise UsageError(f"--grep {request.grep!r}: not a regular expression: {exc}") from exc
    since = parse_since(request.since) if request.since is not None else None
    return Query(nodes=nodes, ranks=ranks, stderr=request.stderr, attempt=request.attempt, since=since, grep=grep,
                 tail=request.tail)


def filter_words(request: LogsRequest) -> list[str]:
    """The filters asked, as they were written (`--rank 1 --grep loss`), to say what matched nothing."""
    words = [f"--node {n}" for n in request.nodes] + [f"--rank {r}" for r in request.ranks]
    words += [f"--grep {request.grep!r}"] if request.grep is not None else []
    words += [f"--since {request.since}"] if request.since is not None else []
    words += [f"--attempt {request.attempt}"] if request.attempt is not None else []
    return words + (["--stderr"] if request.stderr else [])


def known_ranks(job_dir: JobDir, entries: list[Located]) -> frozenset[int]:
    """The job's global ranks: 0 .. world size - 1 from its plan, with any rank its lines name."""
    seen = {e.entry.rank for e in entries if e.entry.rank is not None}
    try:
        world = int(json.loads(job_dir.plan.read_text(encoding="utf-8")).get("world_size") or 0)
    except (OSError, ValueError):
        world = 0
    return frozenset(range(world)) | frozenset(seen)


def summary_text(job_dir: JobDir) -> str:
    """The job's summary as `logs` shows it after the lines ("" while it runs)."""
    try:
        text = escape_controls(job_dir.summary.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return ""
    return text if text.endswith("\n") or not text else text + "\n"


def follow(store: Store, record: JobRecord, query: Query, style: Style, collapse: bool, out: TextIO) -> int:
    """Print the lines there are (the last `query.tail` of them), then new ones as they come, until
    the job ended.

    Returns:
        The job's exit code (1 for a job that ended without one: lost).
    """
    job_dir = store.job_dir(record.id)
    log = JobLog(job_dir.root)
    renderer = Renderer(Query(**{**query.__dict__, "tail": None}), style, collapse, harmless=True)
    try:
        first = "".join(renderer.render(log, log.new_entries()))
        if query.tail is not None:
            first = "".join(deque(split_lines(first), maxlen=query.tail))
        show(first, stream=out, end="")
        out.flush()
        ended = _wait_for_end(store, record.id, log, renderer, out)
        show("".join([*renderer.finish(), *renderer.folded()]), stream=out, end="")
        if not query.narrowed:
            show(summary_text(job_dir), stream=out, end="")
        out.flush()
    finally:
        log.close()
    return exit_code(ended)


def _wait_for_end(store: Store, job_id: str, log: JobLog, renderer: Renderer, out: TextIO) -> JobRecord:
    """Print new lines until the job's record says it ended (then the lines written before that)."""
    while True:
        current = store.get(job_id)
        refresh_lost(store, [current])
        chunks = "".join(renderer.render(log, log.new_entries())) + "".join(renderer.due(time.time()))
        if chunks:
            show(chunks, stream=out, end="")
            out.flush()
        if current.state.finished:
            return current
        time.sleep(FOLLOW_POLL)


def exit_code(record: JobRecord) -> int:
    """What `logs -f` exits with: the job's own exit code."""
    if record.exit_code is not None:
        return record.exit_code
    return int(ExitCode.OK) if record.state is JobState.SUCCEEDED else int(ExitCode.FAILED)


def recover(store: Store, record: JobRecord, say: Callable[[str], None] | None = None) -> dict[str, int]:
    """Rebuild a finished job's files from the copies its hosts kept.

    Raises:
        UsageError: the job still runs (its files are being written), or its backend keeps no copies.
    """
    if not record.state.finished:
        raise UsageError(f"--recover: job {record.id} is still {record.state.value}; its files are being written "
                         f"(wait for it to end, or `distrun stop {record.id}` first)")
    counts = for_record(store, record).recover(record)
    for node, count in counts.items():
        (say or _to_stderr)(note(node, f"recovered {count} line(s) from the host's copy"))
    return counts


def _to_stderr(text: str) -> None:
    show(text, err=True)
