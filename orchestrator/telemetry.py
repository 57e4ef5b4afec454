"""Telemetry on the controller: the latest figures per host and GPU, alerts, the live view, `top`.

Samples come from the hosts' samplers (schema in orchestrator/remote/sampler.py) through
the launcher, which also appends them to telemetry.jsonl. An `Aggregator` keeps the latest
sample per host and GPU and the job's latest metrics record, and turns what it sees into
alerts, each fired once per episode of its condition. A `Monitor` is what the launcher
holds: it feeds the aggregator, checks every second for hosts whose samples stopped, hands
alerts to a callback and, on a terminal, keeps a live table under the scrolling log lines.
`top` renders the same table from a job directory's files.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import util as import_util
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.console import Console, ConsoleOptions
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from orchestrator.logs.sink import job_wide
from orchestrator.remote.gpu import SHIPPED_NVML
from orchestrator.store import JobDir, JobRecord
from orchestrator.stragglers import Detector
from orchestrator.terminal import colour

TICK = 1.0  # seconds between checks for silent hosts, and between redraws of `top`
STARTUP_GRACE = 10.0  # extra time a host gets for its first sample (python start, imports)
TAIL_BYTES = 4 << 20  # how much of a telemetry file `top` reads to find the latest samples
SUMMARY_ALERTS = 10
TABLE_CHROME = 8  # lines of a rendered table that are not rows (title, header, rules, caption)
THROTTLE_ALERT = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


@dataclass(frozen=True)
class AlertRules:
    """When an alert fires; every duration is in seconds."""

    idle_util_pct: float = 5.0
    idle_after_s: float = 60.0
    mem_pct: float = 95.0
    throttle_reasons: frozenset[str] = THROTTLE_ALERT
    throttle_after_s: float = 10.0  # power capping flickers; only a lasting one is worth a line
    silent_min_s: float = 5.0
    silent_intervals: float = 3.0

    def silent_after(self, interval: float) -> float:
        """How long without a sample before a host counts as silent."""
        return max(self.silent_min_s, self.silent_intervals * interval)


@dataclass(frozen=True)
class Alert:
    node: str
    rule: str  # idle | memory | throttle | ecc | xid | silent | straggler
    message: str
    t: float = field(default_factory=time.time)

    def line(self) -> str:
        """As a log line of the node: `ALERT gpu0 idle for 60 s (...)`."""
        return f"ALERT {self.message}"

    def record(self) -> str:
        """As kept in the job record: `14:02:11 node1: gpu0 idle for 60 s (...)`."""
        return f"{time.strftime('%H:%M:%S', time.localtime(self.t))} {self.node}: {self.message}"


@dataclass
class Episode:
    """One alert condition on one host or GPU: fires once while it lasts."""

    since: float | None = None
    fired: bool = False

    def update(self, active: bool, now: float, after: float) -> bool:
        """True exactly once per episode: when the condition has held for `after` seconds."""
        if not active:
            self.since, self.fired = None, False
            return False
        if self.since is None:
            self.since = now
        if not self.fired and now - self.since >= after:
            self.fired = True
            return True
        return False


@dataclass
class HostState:
    """The latest samples of one host."""

    node: str
    host: dict[str, Any] | None = None
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    seen: float | None = None


def mem_pct(sample: dict[str, Any]) -> float | None:
    used, total = sample.get("mem_used_mb"), sample.get("mem_total_mb")
    return 100.0 * used / total if used is not None and total else None


class Aggregator:
    """The latest sample per host and GPU, the latest metrics record, and the alerts they raise.

    Args:
        nodes: the job's hosts, in display order.
        interval: seconds between a host's samples; None turns the silent-host check off.
        rules: alert thresholds.
        clock: time source for episodes and silence (tests pass their own).
    """

    def __init__(self, nodes: Iterable[str], interval: float | None, rules: AlertRules | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = {node: HostState(node) for node in nodes}
        self.interval = interval
        self.rules = rules or AlertRules()
        self.clock = clock
        self.started = clock()
        self.metrics: dict[str, Any] | None = None
        self.alerts: list[Alert] = []
        self.episodes: dict[tuple[str, int | None, str], Episode] = {}
        self.counters: dict[tuple[str, int, str], int] = {}
        self.lock = threading.Lock()

    def observe(self, node: str, sample: dict[str, Any], at: float | None = None) -> list[Alert]:
        """Take one sample from `node` (seen at `at`, default now); returns the alerts it raised."""
        now = self.clock() if at is None else at
        with self.lock:
            state = self.hosts.setdefault(node, HostState(node))
            state.seen = now
            if sample.get("kind") != "gpu":
                state.host = sample
                return []
            state.gpus[int(sample["gpu"])] = sample
            fired = self._gpu_alerts(state, sample, now)
            self.alerts += fired
        return fired

    def observe_metrics(self, record: dict[str, Any]) -> None:
        """Keep the job's latest metrics record (throughput) for display; other ranks' own are not it."""
        if not job_wide(record):
            return
        with self.lock:
            self.metrics = record

    def add(self, alerts: list[Alert]) -> None:
        """Alerts raised elsewhere (stragglers, from metrics), kept with the aggregator's own."""
        with self.lock:
            self.alerts += alerts

    def check(self, nodes: Iterable[str] | None = None, at: float | None = None) -> list[Alert]:
        """Alerts for hosts (all, or `nodes`) whose samples stopped arriving."""
        if self.interval is None:
            return []
        now = self.clock() if at is None else at
        limit = self.rules.silent_after(self.interval)
        fired = []
        with self.lock:
            for node in self.hosts if nodes is None else nodes:
                state = self.hosts.setdefault(node, HostState(node))
                quiet = now - (state.seen if state.seen is not None else self.started + STARTUP_GRACE)
                if self._episode(node, None, "silent").update(quiet > limit, now, 0):
                    heard = "since the last" if state.seen is not None else "and none yet"
                    fired.append(Alert(node, "silent", f"no telemetry samples for {quiet:.0f} s {heard} "
                                       f"(expected every {self.interval:g} s)"))
            self.alerts += fired
        return fired

    def snapshot(self) -> tuple[list[HostState], dict[str, Any] | None]:
        """Copies of the hosts' latest samples and the latest metrics record, for rendering."""
        with self.lock:
            hosts = [HostState(s.node, s.host, dict(s.gpus), s.seen) for s in self.hosts.values()]
            return hosts, self.metrics

    def _episode(self, node: str, gpu: int | None, rule: str) -> Episode:
        return self.episodes.setdefault((node, gpu, rule), Episode())

    def _gpu_alerts(self, state: HostState, sample: dict[str, Any], now: float) -> list[Alert]:
        node, gpu, rules = state.node, int(sample["gpu"]), self.rules
        name = f"gpu{gpu}"
        fired = []
        util = sample.get("util")
        idle = util is not None and util < rules.idle_util_pct and _job_uses(state, gpu)
        if self._episode(node, gpu, "idle").update(idle, now, rules.idle_after_s):
            fired.append(Alert(node, "idle", f"{name} idle for {rules.idle_after_s:g} s "
                               f"(utilisation {util}% < {rules.idle_util_pct:g}%)"))
        pct = mem_pct(sample)
        if self._episode(node, gpu, "memory").update(pct is not None and pct > rules.mem_pct, now, 0):
            fired.append(Alert(node, "memory", f"{name} memory {pct:.0f}% full "
                               f"({sample['mem_used_mb'] / 1024:.1f} of {sample['mem_total_mb'] / 1024:.1f} GB)"))
        reasons = sorted(set(sample.get("throttle") or ()) & rules.throttle_reasons)
        if self._episode(node, gpu, "throttle").update(bool(reasons), now, rules.throttle_after_s):
            fired.append(Alert(node, "throttle", f"{name} clocks throttled ({', '.join(reasons)}) for "
                               f"{rules.throttle_after_s:g} s: {_temp(sample.get('temp_c'))}, "
                               f"{_power(sample.get('power_w'), sample.get('power_limit_w'))}"))
        fired += self._new_errors(node, gpu, sample)
        return fired

    def _new_errors(self, node: str, gpu: int, sample: dict[str, Any]) -> list[Alert]:
        """An alert for each rise of the ECC or XID counters since the previous sample.

        The ECC count runs from when the driver loaded, so the first sample is the baseline;
        the XID count runs from when the sampler started, so every XID in it is new.
        """
        fired = []
        for key, rule, what in (("ecc_uncorrected", "ecc", "uncorrectable ECC"), ("xid", "xid", "XID")):
            value = sample.get(key)
            if value is None:
                continue
            before = self.counters.get((node, gpu, key), 0 if rule == "xid" else None)
            self.counters[(node, gpu, key)] = value
            if before is not None and value > before:
                extra = f", last XID {sample.get('xid_last')}" if rule == "xid" else ""
                fired.append(Alert(node, rule, f"gpu{gpu}: {value - before} new {what} error(s) "
                                   f"({value} in all{extra})"))
        return fired


def _job_uses(state: HostState, gpu: int) -> bool:
    """False for a GPU that holds none of the job's memory while another GPU of the host does.

    A job on 2 of 8 GPUs leaves 6 idle by design; where the job's processes cannot be told
    apart (no per-process figures, or container pids), every GPU counts.
    """
    held = {index: s.get("job_mem_mb") for index, s in state.gpus.items()}
    if not any(held.values()):
        return True
    return bool(held.get(gpu))


def summary_lines(alerts: list[str]) -> list[str]:
    """The alerts part of a job's final summary."""
    if not alerts:
        return []
    lines = [f"  alerts ({len(alerts)}):"] + [f"    {a}" for a in alerts[:SUMMARY_ALERTS]]
    if len(alerts) > SUMMARY_ALERTS:
        lines.append(f"    ... and {len(alerts) - SUMMARY_ALERTS} more (`distrun ps --json`)")
    return lines


# ---------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _temp(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}°C"


def _power(draw: float | None, limit: float | None) -> str:
    if draw is None:
        return "-"
    return f"{draw:.0f}/{limit:.0f} W" if limit else f"{draw:.0f} W"


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
    host = state.host or {}
    parts = []
    if host:
        parts.append(f"load {host.get('load1') or 0:.2f}")
        parts.append(f"net ↓{_rate(host.get('net_rx_bps'))} ↑{_rate(host.get('net_tx_bps'))}")
        procs = host.get("job_procs") or 0
        parts.append(f"job: {procs} proc{'' if procs == 1 else 's'}, cpu {_pct(host.get('job_cpu_pct'))}, "
                     f"rss {(host.get('job_rss_mb') or 0) / 1024:.1f} GB")
    parts.append(_age(state, now))
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
            _temp(gpu.get("temp_c")), _power(gpu.get("power_w"), gpu.get("power_limit_w")), _gpu_info(gpu, rules)]


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
    return ["", f"{len(gpus)} gpus", util, mem, f"max {_temp(max(temps))}" if temps else "-",
            f"{sum(power):.0f} W" if power else "-", info]


def _caption(metrics: dict[str, Any] | None, alerts: list[str]) -> Text:
    parts = []
    if metrics:
        rate = metrics.get("samples_per_s", metrics.get("mean_samples_per_s"))
        if rate is not None:
            step = f" at step {metrics['step']}" if metrics.get("step") is not None else ""
            parts.append(Text(f"throughput {float(rate):.1f} samples/s{step}"))
    if alerts:
        parts.append(Text(f"{len(alerts)} alert(s), latest: {alerts[-1]}", style="red"))
    return Text(" · ").join(parts) if parts else Text("no metrics yet")


def render(aggregator: Aggregator, title: str, now: float | None, alerts: list[str],
           max_rows: int | None = None) -> Table:
    """The status table: a row per host (CPU, memory, load, network, the job's processes) and
    a row per GPU (utilisation, memory, temperature, power), or one row for all of a host's
    GPUs when a row each would pass `max_rows`; the latest throughput and alerts below.

    Args:
        now: the aggregator's clock now, to show each host's last sample as an age; None shows
            the time of day of the last sample instead (a finished job).
        alerts: alerts as kept in the job record.
    """
    hosts, metrics = aggregator.snapshot()
    rules = aggregator.rules
    table = Table(title=title, caption=_caption(metrics, alerts), box=box.SIMPLE_HEAD, title_justify="left",
                  caption_justify="left", pad_edge=False)
    for name in ("node", "dev", "util", "memory", "temp", "power"):
        table.add_column(name, justify="right" if name in ("util", "temp", "power") else "left", no_wrap=True)
    table.add_column("", overflow="fold")  # the notes give way first on a narrow terminal
    per_gpu = max_rows is None or sum(1 + len(h.gpus) for h in hosts) <= max_rows
    for state in hosts:
        table.add_row(*_host_row(state, now, rules))
        if per_gpu:
            for index in sorted(state.gpus):
                table.add_row(*_gpu_row(state.gpus[index], rules))
        elif state.gpus:
            table.add_row(*_gpus_row(state, rules))
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

    LogSink writes each line and flushes every few hundred milliseconds; the lines written
    between flushes go out as one raw print, so a chatty job costs one redraw per flush, not
    one per line, and no parsing per line (rich's Text costs ~100 µs a line). LogSink's
    ANSI colours pass through.
    """

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.pending = ""
        self.lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
        return len(text)

    def flush(self) -> None:
        with self.lock:
            cut = self.pending.rfind("\n") + 1
            lines, self.pending = self.pending[:cut], self.pending[cut:]
            if lines:
                self.console.print(RawLines(lines), end="", crop=False, soft_wrap=True)

    def isatty(self) -> bool:
        return self.console.is_terminal


class Monitor:
    """What the launcher holds: feeds the aggregator, reports alerts, shows the live view.

    Args:
        nodes: the job's hosts.
        interval: the samplers' interval; None when the job has telemetry off.
        on_alert: called with each alert as it fires (from the thread that saw it).
        active: whether a host still runs the job; only those can go silent.
        title: the live view's title (the job id).
        rules: alert thresholds (default: AlertRules()).
        world_size: the job's ranks, for the straggler detector (None: unknown).
    """

    def __init__(self, nodes: list[str], interval: float | None, on_alert: Callable[[Alert], None],
                 active: Callable[[str], bool], title: str, rules: AlertRules | None = None,
                 world_size: int | None = None) -> None:
        self.aggregator = Aggregator(nodes, interval, rules)
        self.stragglers = Detector(world_size)
        self.nodes = nodes
        self.on_alert = on_alert
        self.active = active
        self.title = title
        self.status = ""  # shown after the title (the watchdog's `stalled`)
        self.live: Live | None = None
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)

    def terminal(self, terminal: TextIO | None, live: bool) -> TextIO | None:
        """Where log lines go: through the live view when `live` and `terminal` is a TTY, else `terminal`."""
        if not live or terminal is None or not terminal.isatty():
            return terminal
        console = Console(file=terminal, no_color=not colour(terminal))
        self.live = Live(console=console, get_renderable=self.frame, refresh_per_second=2)
        return ConsoleWriter(console)

    def frame(self) -> Table:
        """The live table now."""
        started = self.aggregator.started
        now = self.aggregator.clock()
        elapsed = int(now - started)
        height = self.live.console.height if self.live is not None else None
        status = f" · {self.status}" if self.status else ""
        return render(self.aggregator, f"{self.title} · {elapsed // 60}m{elapsed % 60:02d}s{status}", now,
                      [a.record() for a in self.aggregator.alerts],
                      None if height is None else max(height - TABLE_CHROME, 1))

    def sample(self, node: str, sample: dict[str, Any]) -> None:
        if not self.stopped.is_set():
            self._report(self.aggregator.observe(node, sample))

    def metrics(self, node: str, record: dict[str, Any]) -> None:
        """A metrics record of any rank of `node`: rank 0's is the job's latest; every rank's
        own step time goes to the straggler detector, whose verdicts are alerts like the others."""
        self.aggregator.observe_metrics(record)
        alerts = [Alert(s.node, "straggler", s.message()) for s in self.stragglers.observe(node, record)]
        if alerts and not self.stopped.is_set():
            self.aggregator.add(alerts)
            self._report(alerts)

    def start(self) -> None:
        self.ticker.start()
        if self.live is not None:
            self.live.start()

    def stop(self) -> None:
        """Stop checking and leave the last frame of the live view on screen; safe to call twice."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.live is not None:
            self.live.stop()

    def _tick(self) -> None:
        while not self.stopped.wait(TICK):
            self._report(self.aggregator.check([n for n in self.nodes if self.active(n)]))

    def _report(self, alerts: list[Alert]) -> None:
        """Hand alerts on, unless the job's summary is already being written."""
        for alert in alerts:
            if not self.stopped.is_set():
                self.on_alert(alert)


# ---------------------------------------------------------------- shipping NVML


@cache
def _nvml_source() -> str | None:
    spec = import_util.find_spec("pynvml")
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin).read_text(encoding="utf-8")


def shipped_modules(gpus: int) -> dict[str, str]:
    """Modules to ship with a host's supervisor: this controller's NVML bindings to a host with GPUs.

    The sampler prefers the host's own `pynvml`; the shipped copy (~330 KB, ~50 ms to compile
    on the host) is its fallback, and is not sent to hosts whose probe found no GPU.

    Args:
        gpus: The GPUs the host's probe found.
    """
    source = _nvml_source() if gpus > 0 else None
    return {SHIPPED_NVML: source} if source else {}


# ---------------------------------------------------------------- top


class JsonlFollower:
    """The JSON lines appended to a file since the last read; starts near the end of a big file."""

    def __init__(self, path: Path, tail_bytes: int = TAIL_BYTES) -> None:
        self.path = path
        self.offset = max(0, path.stat().st_size - tail_bytes) if path.exists() else 0
        self.rest = b""
        self.skip_partial = self.offset > 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = self.rest + fh.read()
        self.offset += len(data) - len(self.rest)
        cut = data.rfind(b"\n") + 1
        lines, self.rest = data[:cut].splitlines(), data[cut:]
        if self.skip_partial and lines:
            lines, self.skip_partial = lines[1:], False
        return [r for r in (_json(line) for line in lines) if r is not None]


def _json(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class History:
    """A job directory's telemetry and metrics files, followed into an aggregator (for `top`)."""

    def __init__(self, job_dir: JobDir, nodes: list[str]) -> None:
        self.aggregator = Aggregator(nodes, plan_interval(job_dir), clock=time.time)
        self.telemetry = JsonlFollower(job_dir.telemetry)
        self.metrics = JsonlFollower(job_dir.metrics)

    def poll(self) -> None:
        for sample in self.telemetry.read():
            node = sample.get("node") or sample.get("host")
            if node:
                self.aggregator.observe(str(node), sample, at=sample.get("t"))
        for record in self.metrics.read():
            self.aggregator.observe_metrics(record)


def plan_interval(job_dir: JobDir) -> float | None:
    """The job's telemetry interval from its plan.json (None when telemetry was off or unknown)."""
    try:
        value = json.loads(job_dir.plan.read_text(encoding="utf-8")).get("telemetry_interval")
    except (OSError, ValueError):
        return None
    return float(value) if value else None


def top_sample(job_dir: JobDir, record: JobRecord) -> dict[str, Any]:
    """`distrun top --json`: the job's latest figures as one JSON-ready sample.

    Returns:
        {"job", "state", "time", "hosts": [{"node", "seen", "host": the host's latest sample or
        null, "gpus": [each GPU's latest sample]}], "metrics": the latest metrics record or null,
        "alerts": [...]}; samples carry the keys the samplers write (telemetry.jsonl).
    """
    history = History(job_dir, record.hosts)
    history.poll()
    hosts, metrics = history.aggregator.snapshot()
    return {
        "job": record.id, "state": record.state.value, "time": time.time(),
        "hosts": [{"node": h.node, "seen": h.seen, "host": h.host, "gpus": [h.gpus[g] for g in sorted(h.gpus)]}
                  for h in hosts],
        "metrics": metrics, "alerts": list(record.alerts),
    }


def top(job_dir: JobDir, current: Callable[[], JobRecord], console: Console, once: bool = False) -> None:
    """Show a job's table: refreshed every TICK seconds until a running job ends, else one frame.

    Args:
        current: the job's record as it is now (state and alerts).
        once: print one frame even for a running job.
    """
    record = current()
    history = History(job_dir, record.hosts)
    history.poll()

    def frame() -> Table:
        running = not record.state.finished
        return render(history.aggregator, f"{record.id} · {record.state.value}", time.time() if running else None,
                      record.alerts, max(console.height - TABLE_CHROME, 1) if console.is_terminal else None)

    if once or record.state.finished or not console.is_terminal:
        console.print(frame())
        return
    with Live(console=console, get_renderable=frame, refresh_per_second=1, transient=False) as live:
        while not record.state.finished:
            time.sleep(TICK)
            record = current()
            history.poll()
            live.refresh()
