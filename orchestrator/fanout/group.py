"""Many hosts at once: a group of connections, a result per host, one error carrying them all.

fabric's `Group` / `GroupResult` is the model. Every fan-out of distrun (launch, doctor, exec,
the bandwidth test, stop, sync, recover) goes through here:

    with Group(nodes) as group:          # leaving the block closes every connection, whatever happened
        group.connect()                  # every host at once; GroupError names each host that failed
        versions = group.run(lambda t: t.run(["python3", "-V"]))
        versions.succeeded, versions.failed

`run` connects each host that is not connected yet in the same task as the call, so a slow
host never holds back the others. A call never raises for one host: its exception is that
host's result. `GroupResult.check()` (and `connect()`) raise one `GroupError` after every host
answered, so a check over 64 hosts reports all 64.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import Generic, TypeVar

from orchestrator.console.display import fold_hosts
from orchestrator.console.terminal import ProgressCounter
from orchestrator.errors import DistrunError, ExitCode, InfraError, one_line
from orchestrator.spec.model import NodeSpec
from orchestrator.transport import Transport, transport_for
from orchestrator.transport.base import reach_hint

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 64
# How often the main thread wakes while it waits for hosts. A signal that the kernel gives to
# another thread only sets a flag: a main thread blocked on a lock without a timeout would never
# run its handler (Ctrl-C or SIGTERM would be ignored until every host answered).
SIGNAL_POLL = 0.1


class GroupResult(dict[str, "R | Exception"], Generic[R]):
    """Each host's result (or the exception its call raised), by host name, in the hosts' order."""

    @property
    def succeeded(self) -> dict[str, R]:
        """The hosts whose call returned, with what it returned."""
        return {host: value for host, value in self.items() if not isinstance(value, Exception)}  # type: ignore[misc]

    @property
    def failed(self) -> dict[str, Exception]:
        """The hosts whose call raised, with the exception."""
        return {host: value for host, value in self.items() if isinstance(value, Exception)}

    unreached: frozenset[str] = frozenset()  # hosts whose connect() raised (set by Group.run)

    @property
    def unreachable(self) -> dict[str, Exception]:
        """The hosts that could not be reached or logged into (a subset of `failed`)."""
        return {host: value for host, value in self.failed.items() if host in self.unreached}

    def check(self, what: str = "") -> dict[str, R]:
        """Every host's value when every call succeeded.

        Args:
            what: Words put after each host in the error ("workdir sync failed").

        Raises:
            GroupError: some call raised; it carries this result.
        """
        if self.failed:
            raise GroupError(self, what)
        return self.succeeded


class GroupError(InfraError):
    """Calls failed on some hosts. `str()` is one line naming each host; `result` has them all.

    Identical errors of several hosts are folded under one host range (`node[1-3]: connection
    refused`); `render(fold=False)` lists each host's own message. The exit code is the one the
    hosts' errors share (a UsageError on every host exits 2), else 3: infrastructure.
    """

    def __init__(self, result: GroupResult[object], what: str = "") -> None:
        self.result = result
        self.what = what
        codes = {e.exit_code if isinstance(e, DistrunError) else ExitCode.INFRA for e in result.failed.values()}
        self.exit_code = codes.pop() if len(codes) == 1 else ExitCode.INFRA
        super().__init__(self.render())

    @property
    def failed(self) -> dict[str, Exception]:
        return self.result.failed

    def render(self, fold: bool = True) -> str:
        """`node[1-2]: unreachable: connection refused; node4 (10.0.0.14:22): auth failed ...`: one line,
        ending with doctor's fix hint when a host was not reached or not logged into."""
        hint = reach_hint(self.failed.values())
        return "; ".join(self.lines(fold)) + (f" (fix: {hint})" if hint else "")

    def lines(self, fold: bool = True) -> list[str]:
        """One line per host, or per set of hosts with the same error when `fold` (see `fold_errors`)."""
        return fold_errors({host: one_line(exc) for host, exc in self.failed.items()}, self.what, fold)


def fold_errors(messages: Mapping[str, str], what: str = "", fold: bool = True) -> list[str]:
    """Hosts' one-line errors, those of hosts that share an error folded into one line.

    A host alone keeps its own message (which names it, often with its address); hosts that
    share an error are named by their range, before the error without the host.

    Args:
        messages: Host -> its error, each naming the host first (`node1 (10.0.0.11:22): ...`).
        what: Words put after the hosts ("workdir sync failed").
        fold: Fold hosts that share an error (else one line per host).

    Returns:
        E.g. ["node[1-2]: unreachable: connection refused", "node4 (10.0.0.14:22): auth failed"].
    """
    prefix = f"{what}: " if what else ""
    groups = _groups({host: without_host(host, text) for host, text in messages.items()}) if fold else \
        [([host], without_host(host, text)) for host, text in messages.items()]
    return [messages[hosts[0]] if len(hosts) == 1 and not prefix else f"{fold_hosts(hosts)}: {prefix}{text}"
            for hosts, text in groups]


def without_host(host: str, text: str) -> str:
    """A message without its leading `host: ` or `host (10.0.0.1:22): `, so hosts can share it."""
    return re.sub(rf"^{re.escape(host)}(?: \([^)]*\))?: ", "", text)


def _groups(messages: Mapping[str, str]) -> list[tuple[list[str], str]]:
    by_text: dict[str, list[str]] = {}
    for host, text in messages.items():
        by_text.setdefault(text, []).append(host)
    return [(hosts, text) for text, hosts in by_text.items()]


def parallel(items: Iterable[T], fn: Callable[[T], R], key: Callable[[T], str]) -> GroupResult[R]:
    """Call `fn` on every item at once (threads, at most MAX_WORKERS).

    Returns:
        {key(item): what fn returned, or the Exception it raised}, in the items' order.
    """
    items = list(items)
    result: GroupResult[R] = GroupResult()
    if not items:
        return result
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        futures = [(key(item), pool.submit(fn, item)) for item in items]
        for name, future in futures:
            _wait_awake(future)
            try:
                result[name] = future.result()
            except Exception as exc:
                result[name] = exc
    return result


def _wait_awake(future: Future[R]) -> None:
    """Wait for `future`, waking every SIGNAL_POLL so that the main thread runs signal handlers."""
    while not future.done():
        wait([future], timeout=SIGNAL_POLL)


class Group:
    """Connections to a set of hosts; a context manager that closes them all on leaving.

    Args:
        nodes: The hosts, in the order results are given.
        make: Builds a node's transport (default: the one its inventory entry asks for).
        progress: Counts the hosts connected (`connected 41/64` on a terminal); the count is
            erased once every host has answered.
    """

    def __init__(self, nodes: Iterable[NodeSpec], make: Callable[[NodeSpec], Transport] = transport_for,
                 progress: ProgressCounter | None = None) -> None:
        self.transports: dict[str, Transport] = {node.name: make(node) for node in nodes}
        self.progress = progress

    def __enter__(self) -> Group:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def __len__(self) -> int:
        return len(self.transports)

    @property
    def names(self) -> list[str]:
        return list(self.transports)

    def connect(self, strict: bool = True) -> GroupResult[None]:
        """Open every connection at once.

        Args:
            strict: Raise when any host failed (else the caller reads `.failed` / `.unreachable`).

        Raises:
            GroupError: with `strict`, some host could not be reached; every connection is closed first.
        """
        result = self.run(lambda _t: None)
        if strict and result.failed:
            self.close()
            result.check()
        return result

    def run(self, fn: Callable[[Transport], R], only: Iterable[str] | None = None) -> GroupResult[R]:
        """Call `fn(transport)` on every host at once, connecting each one first where needed.

        Args:
            fn: What to do on one host; what it returns (or raises) is the host's result.
            only: The hosts to call, by name (default: all).

        Returns:
            Each host's result, in the group's order.
        """
        chosen = self.transports.values() if only is None else [self.transports[name] for name in only]
        unreached: set[str] = set()

        def call(transport: Transport) -> R:
            try:
                transport.connect()
            except Exception:
                unreached.add(transport.name)
                raise
            if self.progress is not None:
                self.progress.tick(transport.name)
            return fn(transport)

        try:
            result = parallel(chosen, call, key=lambda t: t.name)
        finally:
            if self.progress is not None:
                self.progress.clear()
        result.unreached = frozenset(unreached)
        return result

    def close(self) -> None:
        """Close every connection at once; a connection that fails to close is let go."""
        parallel(self.transports.values(), lambda t: t.close(), key=lambda t: t.name)
