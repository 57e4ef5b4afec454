"""Telemetry's table (for the live view and `top`), and the live view: a `Monitor` is what the
launcher holds: it feeds the aggregator, checks every second for hosts whose samples stopped,
hands alerts to a callback and, on a terminal, keeps a live table under the scrolling log lines."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rich import box
from rich.console import Console, ConsoleOptions
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from orchestrator.console.terminal import colour, safe_text
from orchestrator.diagnose.held import HeldDetector
from orchestrator.diagnose.progress import FlightProgress, progress_line
from orchestrator.diagnose.stragglers import Detector, FlightDetector
from orchestrator.telemetry.alerts import (
    Aggregator,
    Alert,
    AlertRules,
    HostState,
    host_evidence,
    mem_pct,
    power_text,
    recorded,
    temp_text,
)

TICK = 1.0  # seconds between checks for silent hosts
TABLE_CHROME = 8  # lines of a rendered table that are not rows (title, header, rules, caption)
PRINT_EVERY = 0.2  # seconds between two prints of log lines: each print redraws the table under them


# ---------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _size(used: float | None, total: float | None) -> str:
    """MB figures as `71.2/80.0 GB` (or MB when small)."""
    if used is None or total is None:
        return "-"
    if total >= 1024:
        return f"{used / 1024:.1f}/{total / 1024:.1f} GB"
    return f"{used:.0f}/{total:.0f} MB"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "-"
    for unit in ("B", "KB", "MB"):
        if bps < 1024:
            return f"{bps:.0f} {unit}/s"
        bps /= 1024
    return f"{bps:.1f} GB/s"


def _age(state: HostState, now: float | None) -> str:
    if state.seen is None:
        return "no sample yet"
    if now is None:
        return "last " + time.strftime("%H:%M:%S", time.localtime(state.seen))
    return f"{max(0.0, now - state.seen):.1f} s ago"


def _host_info(state: HostState, now: float | None) -> str:
    """The host's notes, the most telling first (the sample's age, the job's processes), as a
    narrow terminal cuts them at its edge."""
    host = state.host or {}
    parts = [_age(state, now)]
    if host:
        procs = host.get("job_procs") or 0
        parts.append(f"job: {procs} proc{'' if procs == 1 else 's'}, cpu {_pct(host.get('job_cpu_pct'))}, "
                     f"rss {(host.get('job_rss_mb') or 0) / 1024:.1f} GB")
        parts.append(f"load {host.get('load1') or 0:.2f}")
        parts.append(f"net ↓{_rate(host.get('net_rx_bps'))} ↑{_rate(host.get('net_tx_bps'))}")
    return " · ".join(parts)


def _gpu_info(gpu: dict[str, Any], rules: AlertRules) -> Text:
    parts = [Text(f"{gpu['sm_clock_mhz']} MHz")] if gpu.get("sm_clock_mhz") is not None else []
    if gpu.get("job_mem_mb"):
        parts.append(Text(f"job {gpu['job_mem_mb'] / 1024:.1f} GB"))
    throttle = [r for r in gpu.get("throttle") or () if r != "gpu_idle"]
    if throttle:
        bad = rules.throttle_reasons & set(throttle)
        parts.append(Text(f"throttle: {', '.join(throttle)}", style="red" if bad else "yellow"))
    for key, label in (("ecc_uncorrected", "ECC"), ("xid", "XID")):
        if gpu.get(key):
            parts.append(Text(f"{label} {gpu[key]}", style="red"))
    return Text(" · ").join(parts)


def _util_cell(util: float | None, rules: AlertRules) -> Text:
    low = util is not None and util < rules.idle_util_pct
    return Text(_pct(util), style="yellow" if low else "")


def _mem_cell(sample: dict[str, Any], rules: AlertRules) -> Text:
    pct = mem_pct(sample)
    full = pct is not None and pct > rules.mem_pct
    return Text(_size(sample.get("mem_used_mb"), sample.get("mem_total_mb")), style="red" if full else "")


def _gpu_row(gpu: dict[str, Any], rules: AlertRules) -> list[Any]:
    return ["", f"gpu{gpu['gpu']}", _util_cell(gpu.get("util"), rules), _mem_cell(gpu, rules),
            temp_text(gpu.get("temp_c")), power_text(gpu.get("power_w"), gpu.get("power_limit_w")),
            _gpu_info(gpu, rules)]


def _host_row(state: HostState, now: float | None, rules: AlertRules) -> list[Any]:
    host = state.host or {}
    return [state.node, "cpu", _pct(host.get("cpu_pct")), _mem_cell(host, rules), "", "", _host_info(state, now)]


def _gpus_row(state: HostState, rules: AlertRules) -> list[Any]:
    """All of a host's GPUs in one row: mean (and lowest) utilisation, fullest memory, hottest, total power."""
    gpus = list(state.gpus.values())
    utils = [g["util"] for g in gpus if g.get("util") is not None]
    mems = [p for p in (mem_pct(g) for g in gpus) if p is not None]
    temps = [g["temp_c"] for g in gpus if g.get("temp_c") is not None]
    power = [g["power_w"] for g in gpus if g.get("power_w") is not None]
    util = Text(f"{sum(utils) / len(utils):.0f}% (min {min(utils):.0f}%)" if utils else "-",
                style="yellow" if utils and min(utils) < rules.idle_util_pct else "")
    mem = Text(f"max {max(mems):.0f}%" if mems else "-", style="red" if mems and max(mems) > rules.mem_pct else "")
    throttled = sorted({r for g in gpus for r in g.get("throttle") or () if r in rules.throttle_reasons})
    info = Text(f"throttle: {', '.join(throttled)}", style="red") if throttled else ""
    return ["", f"{len(gpus)} gpus", util, mem, f"max {temp_text(max(temps))}" if temps else "-",
            f"{sum(power):.0f} W" if power else "-", info]


def _caption(metrics: dict[str, Any] | None, alerts: list[Any], progress: dict[str, Any] | None = None) -> Text:
    parts = []
    rate = metrics.get("samples_per_s", metrics.get("mean_samples_per_s")) if metrics else None
    if metrics and rate is not None:
        step = f" at step {metrics['step']}" if metrics.get("step") is not None else ""
        parts.append(Text(f"throughput {float(rate):.1f} samples/s{step}"))
    elif progress and progress.get("ranks"):
        parts.append(Text(f"progress {progress_line(progress)}"))
    if alerts:
        parts.append(Text(f"{len(alerts)} alert(s), latest: {recorded(alerts[-1]).text()}", style="red"))
    return Text(" · ").join(parts) if parts else Text("no metrics yet")


def render(aggregator: Aggregator, title: str, now: float | None, alerts: list[Any],
           max_rows: int | None = None, progress: dict[str, Any] | None = None, fit: bool = True) -> Table:
    """The status table: a row per host (CPU, memory, load, network, the job's processes) and
    a row per GPU (utilisation, memory, temperature, power), or one row for all of a host's
    GPUs when a row each would pass `max_rows`; the latest throughput and alerts below. Hosts
    past `max_rows` are one row that counts them: a row the screen cannot show is never built
    (the live view redraws twice a second, and a table of 4096 hosts cost more than the job's lines).

    Args:
        now: the aggregator's clock now, to show each host's last sample as an age; None shows
            the time of day of the last sample instead (a finished job).
        alerts: alerts as kept in the job record (`Alert.record()`, or an older distrun's sentences).
        progress: the job's progress from the ranks' Flight Recorders (`FlightProgress.to_dict`),
            shown when no metrics record tells the throughput.
        fit: a terminal's table: as wide as the terminal, the notes and the caption cut at its edge
            so that each row stays one line; else (a pipe, a file) every note whole, folded if need be.
    """
    hosts, metrics = aggregator.snapshot()
    rules = aggregator.rules
    caption = _caption(metrics, alerts, progress)
    if fit:
        caption.no_wrap, caption.overflow = True, "ellipsis"
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, title_justify="left",
                  caption_justify="left", pad_edge=False, expand=fit)
    for name in ("node", "dev", "util", "memory", "temp", "power"):
        table.add_column(name, justify="right" if name in ("util", "temp", "power") else "left", no_wrap=True)
    # The notes give way first: on a terminal they take what the other columns leave, cut at its edge.
    table.add_column("", no_wrap=fit, overflow="ellipsis" if fit else "fold", ratio=1 if fit else None)
    shown = hosts if max_rows is None or len(hosts) <= max_rows else hosts[:max(max_rows - 1, 1)]
    per_gpu = max_rows is None or sum(1 + len(h.gpus) for h in shown) <= max_rows
    for state in shown:
        table.add_row(*_host_row(state, now, rules))
        if per_gpu:
            for index in sorted(state.gpus):
                table.add_row(*_gpu_row(state.gpus[index], rules))
        elif state.gpus:
            table.add_row(*_gpus_row(state, rules))
    if len(shown) < len(hosts):
        table.add_row(f"… {len(hosts) - len(shown)} more hosts", "", "", "", "", "", "")
    return table


# ---------------------------------------------------------------- live view


class RawLines:
    """Text that a rich console writes as it is, escape codes included, without parsing it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        yield Segment(self.text)


class ConsoleWriter(io.TextIOBase):
    """A text stream that prints whole lines through a rich console, above its live area.

    The lines written between prints go out as one raw print, at most one every `every` seconds
    (a flush sooner waits for its turn): a chatty job costs a few redraws a second, not one per
    flush of the terminal's writer, and no parsing per line (rich's Text costs ~100 µs a line).
    LogSink's ANSI colours pass through.
    """

    def __init__(self, console: Console, every: float = PRINT_EVERY) -> None:
        super().__init__()
        self.console = console
        self.every = every
        self.pending = ""
        self.printed = 0.0  # when the last print was (monotonic)
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
        return len(text)

    def flush(self) -> None:
        """Print the whole lines written, now or (within `every` of the last print) at its turn.
        Without a whole line there is nothing to do: no timer either (the interpreter's exit flushes
        the writer, and a thread started then never starts: the process would hang)."""
        with self.lock:
            if "\n" not in self.pending:
                return
            wait = self.printed + self.every - time.monotonic()
            if wait > 0:
                if self.timer is None:
                    self.timer = threading.Timer(wait, self.drain)
                    self.timer.daemon = True
                    self.timer.start()
                return
        self.drain()

    def drain(self) -> None:
        """Print the whole lines written, now."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            cut = self.pending.rfind("\n") + 1
            lines, self.pending = self.pending[:cut], self.pending[cut:]
            if lines:
                self.console.print(RawLines(safe_text(lines)), end="", crop=False, soft_wrap=True)
                self.printed = time.monotonic()

    def isatty(self) -> bool:
        return self.console.is_terminal


class Monitor:
    """What an attempt (run/attempt.py) holds: feeds the aggregator, reports alerts, shows the live view.

    Args:
        nodes: the job's hosts.
        interval: the samplers' interval; None when the job has telemetry off.
        on_alerts: called with the alerts that fired together (from the thread that saw them):
            one call for the hosts that went silent in one check, not one per host.
        active: whether a host still runs the job; only those can go silent.
        waiting: whether output of a host waits unread in the controller (its silence is not its own).
        title: the live view's title (the job id).
        rules: alert thresholds (default: AlertRules()).
        world_size: the job's ranks, for the straggler detector (None: unknown).
    """

    def __init__(self, nodes: list[str], interval: float | None, on_alerts: Callable[[list[Alert]], None],
                 active: Callable[[str], bool], title: str, rules: AlertRules | None = None,
                 world_size: int | None = None, waiting: Callable[[str], bool] = lambda _node: False) -> None:
        self.aggregator = Aggregator(nodes, interval, rules)
        self.stragglers = Detector(world_size)
        self.late = FlightDetector(world_size) if world_size else None
        self.held = HeldDetector(world_size) if world_size else None
        self.progress = FlightProgress(world_size)
        self.progress_lock = threading.Lock()
        # The ranks each path named (metrics lines, Flight Recorders): a rank one named, the other does not name again.
        self.named: dict[str, set[int]] = {"metrics": set(), "flight": set(), "held": set()}
        self.nodes = nodes
        self.on_alerts = on_alerts
        self.active = active
        self.waiting = waiting
        self.title = title
        self.status = ""  # shown after the title (the watchdog's `stalled`)
        self.live: Live | None = None
        self.writer: ConsoleWriter | None = None
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)

    def terminal(self, terminal: TextIO | None, live: bool) -> TextIO | None:
        """Where log lines go: through the live view when `live` and `terminal` is a TTY, else `terminal`."""
        if not live or terminal is None or not terminal.isatty():
            return terminal
        console = Console(file=terminal, no_color=not colour(terminal))
        # Transient: the table goes when the job ends, so the summary follows the job's last lines.
        self.live = Live(console=console, get_renderable=self.frame, refresh_per_second=2, transient=True)
        self.writer = ConsoleWriter(console)
        return self.writer

    def frame(self) -> Table:
        """The live table now."""
        started = self.aggregator.started
        now = self.aggregator.clock()
        elapsed = int(now - started)
        height = self.live.console.height if self.live is not None else None
        status = f" · {self.status}" if self.status else ""
        return render(self.aggregator, f"{self.title} · {elapsed // 60}m{elapsed % 60:02d}s{status}", now,
                      [a.record() for a in self.aggregator.alerts],
                      None if height is None else max(height - TABLE_CHROME, 1), self.progress_now())

    def sample(self, node: str, sample: dict[str, Any]) -> None:
        if not self.stopped.is_set():
            self._report(self.aggregator.observe(node, sample))

    def metrics(self, node: str, record: dict[str, Any]) -> None:
        """A metrics record of any rank of `node`: rank 0's is the job's latest; every rank's
        own step time goes to the straggler detector, whose verdicts are alerts like the others."""
        self.aggregator.observe_metrics(record)
        alerts = [Alert(s.node, "straggler", s.message(), rank=s.rank, figures=s.figures())
                  for s in self.stragglers.observe(node, record) if self._first_to_name("metrics", s.rank)]
        if alerts and not self.stopped.is_set():
            self.aggregator.add(alerts)
            self._report(alerts)

    def flight(self, node: str, event: dict[str, Any]) -> dict[str, Any]:
        """An `fr` event of `node` (remote/frpoll.py): the job's progress, and stragglers named from
        when each rank entered the collectives or from its process held off its CPU (diagnose/held.py),
        with what telemetry says of their host now; the progress as it stands (`FlightProgress.to_dict`)."""
        with self.progress_lock:
            self.progress.observe(event, time.time())
        late = self.late.observe(node, event) if self.late is not None else []
        with self.progress_lock:
            held = self.held.observe(node, event) if self.held is not None else []
        named = [("flight", r) for r in late] + [("held", r) for r in held]
        alerts = [Alert(r.node, "straggler", r.message(evidence), rank=r.rank, figures=r.figures(), evidence=evidence)
                  for path, r in named if self._first_to_name(path, r.rank)
                  for evidence in [host_evidence(self.aggregator.state(r.node))]]
        if alerts and not self.stopped.is_set():
            self.aggregator.add(alerts)
            self._report(alerts)
        return self.progress_now()

    def _first_to_name(self, path: str, rank: int) -> bool:
        """Whether a straggler alert of `rank` from `path` is new: the other path has not named it."""
        with self.progress_lock:
            self.named[path].add(rank)
            return not any(rank in ranks for other, ranks in self.named.items() if other != path)

    def progress_now(self, ended: bool = False) -> dict[str, Any]:
        """The job's progress from the ranks' Flight Recorders (`FlightProgress.to_dict`; `ended`: a
        finished job's, its rate the whole run's)."""
        with self.progress_lock:
            found = self.progress.to_dict(ended)
        if self.late is not None and sum(self.late.skew.counts):
            with self.late.lock:
                found["skew"] = self.late.skew.to_dict()
        return found

    def start(self) -> None:
        self.ticker.start()
        if self.live is not None:
            self.live.start()

    def stop(self) -> None:
        """Stop checking and clear the live view from the screen (the log lines stay); safe to call twice."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.writer is not None:
            self.writer.drain()  # the last lines go above the table, which then goes
        if self.live is not None:
            self.live.stop()

    def _tick(self) -> None:
        while not self.stopped.wait(TICK):
            active = [n for n in self.nodes if self.active(n)]
            self._report(self.aggregator.check(active, waiting=[n for n in active if self.waiting(n)]))

    def _report(self, alerts: list[Alert]) -> None:
        """Hand alerts on, unless the job's summary is already being written."""
        if alerts and not self.stopped.is_set():
            self.on_alerts(alerts)
