"""Telemetry alerts: the rules, and an `Aggregator` that keeps the latest sample per host and GPU
and the job's latest metrics record and turns what it sees into alerts, each fired once per
episode of its condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.console.terminal import safe_text
from orchestrator.logs.sink import job_wide

STARTUP_GRACE = 10.0  # extra time a host gets for its first sample (python start, imports)
SUMMARY_ALERTS = 10
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


RULES = ("idle", "memory", "throttle", "ecc", "xid", "silent", "straggler", "stall", "rendezvous")
# How an older distrun's alert (its sentence only) began, by rule: read back without a pattern.
OLD_STARTS = (("straggler", "straggler: "), ("silent", "no telemetry samples "), ("stall", "stall: "),
              ("rendezvous", "never joined the rendezvous "))
OLD_GPU_WORDS = (("ecc", " new uncorrectable ECC "), ("xid", " new XID "), ("idle", " idle for "),
                 ("memory", " memory "), ("throttle", " clocks throttled "))


@dataclass(frozen=True)
class Alert:
    """One alert: its fields and its sentence.

    Attributes:
        node: The host it is about.
        rule: What fired it (RULES; "other" for an older record's sentence no rule began).
        message: The sentence people read (`straggler: rank 4 on node2 ...`).
        rank: The rank it names, or None.
        figures: What the rule measured (numbers and short strings: `late_ms`, `gpu`, ...).
        evidence: What else was seen of the host when it fired (`node2 now: load 5.1, ...`), or "".
        stamp: An older record's time of day (`14:02:11`), where it kept no `t`.
    """

    node: str
    rule: str
    message: str
    t: float = field(default_factory=time.time)
    rank: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    evidence: str = ""
    stamp: str = ""

    def line(self) -> str:
        """As a log line of the node: `ALERT gpu0 idle for 60 s (...)`."""
        return f"ALERT {self.message}"

    def text(self) -> str:
        """As people read it after the fact: `14:02:11 node1: gpu0 idle for 60 s (...)`."""
        stamp = time.strftime("%H:%M:%S", time.localtime(self.t)) if self.t else self.stamp
        return " ".join(filter(None, (stamp, f"{self.node}:" if self.node else "", self.message)))

    def record(self) -> dict[str, Any]:
        """As kept in the job record: {"t", "node", "rule", "rank", "message", "figures", "evidence"}."""
        return {"t": round(self.t, 3), "node": self.node, "rule": self.rule, "rank": self.rank,
                "message": self.message, "figures": dict(self.figures), "evidence": self.evidence}


def recorded(entry: object) -> Alert:
    """An alert of a job record back as an `Alert`: a record's object, or an older distrun's sentence
    (`14:02:11 node1: straggler: rank 3 takes ...`: its host, time of day, rule and rank read off it)."""
    if isinstance(entry, dict):
        rank, figures, t = entry.get("rank"), entry.get("figures"), entry.get("t")
        return Alert(str(entry.get("node") or ""), str(entry.get("rule") or "other"), str(entry.get("message") or ""),
                     float(t) if isinstance(t, int | float) else 0.0,
                     rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                     dict(figures) if isinstance(figures, dict) else {}, str(entry.get("evidence") or ""))
    text = str(entry)
    stamp, _, rest = text.partition(" ")
    node, _, message = rest.partition(": ")
    if len(stamp) != 8 or stamp[2::3] != "::" or not message:
        stamp, node, message = "", "", text
    return Alert(node, _old_rule(message), message, 0.0, _old_rank(message), stamp=stamp)


def _old_rule(message: str) -> str:
    """The rule of an older record's sentence, from how it begins."""
    found = next((rule for rule, start in OLD_STARTS if message.startswith(start)), None)
    if found is None and message.startswith("gpu"):
        found = next((rule for rule, words in OLD_GPU_WORDS if words in message), None)
    return found or "other"


def _old_rank(message: str) -> int | None:
    """The rank an older straggler sentence names (`straggler: rank 3 ...`)."""
    words = message.split(" ", 3)
    return int(words[2]) if words[:2] == ["straggler:", "rank"] and len(words) > 2 and words[2].isdigit() else None



@dataclass
class AlertEpisode:
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
    waited: float | None = None  # when its output last waited unread in the controller: a word from it


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
        self.ranks: dict[int, dict[str, Any]] = {}  # each rank's latest metrics record (step, step time)
        self.alerts: list[Alert] = []
        self.episodes: dict[tuple[str, int | None, str], AlertEpisode] = {}
        self.counters: dict[tuple[str, int, str], int] = {}
        self.lock = threading.Lock()

    def observe(self, node: str, sample: dict[str, Any], at: float | None = None) -> list[Alert]:
        """Take one sample from `node` (seen at `at`, default now), its text made safe for a
        terminal (a host's strings reach `top`'s table, which rich draws); returns the alerts it raised."""
        sample = _safe_values(sample)
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
        """Keep each rank's latest metrics record, and the job's (throughput) for display: rank 0's,
        or one without a rank; other ranks' own are not it."""
        rank = record.get("rank")
        with self.lock:
            if isinstance(rank, int) and not isinstance(rank, bool):
                self.ranks[rank] = record
            if job_wide(record):
                self.metrics = record

    def add(self, alerts: list[Alert]) -> None:
        """Alerts raised elsewhere (stragglers, from metrics), kept with the aggregator's own."""
        with self.lock:
            self.alerts += alerts

    def check(self, nodes: Iterable[str] | None = None, at: float | None = None,
              waiting: Iterable[str] = ()) -> list[Alert]:
        """Alerts for hosts (all, or `nodes`) whose samples stopped arriving. A host in `waiting` has
        output that waits unread in the controller (as the heartbeat rule, run/hostrun.py): its
        samples may be in it, so its silence counts from now on."""
        if self.interval is None:
            return []
        now = self.clock() if at is None else at
        limit = self.rules.silent_after(self.interval)
        fired = []
        with self.lock:
            for node in waiting:
                self.hosts.setdefault(node, HostState(node)).waited = now
            for node in self.hosts if nodes is None else nodes:
                state = self.hosts.setdefault(node, HostState(node))
                heard = state.seen if state.seen is not None else self.started + STARTUP_GRACE
                quiet = now - max(heard, state.waited or heard)
                if self._episode(node, None, "silent").update(quiet > limit, now, 0):
                    heard = "since the last" if state.seen is not None else "and none yet"
                    fired.append(Alert(node, "silent", f"no telemetry samples for {quiet:.0f} s {heard} "
                                       f"(expected every {self.interval:g} s)",
                                       figures={"quiet_s": round(quiet, 1), "interval_s": self.interval}))
            self.alerts += fired
        return fired

    def state(self, node: str) -> HostState | None:
        """A copy of one host's latest samples (None: a host not of the job)."""
        with self.lock:
            s = self.hosts.get(node)
            return None if s is None else HostState(s.node, s.host, dict(s.gpus), s.seen)

    def snapshot(self) -> tuple[list[HostState], dict[str, Any] | None]:
        """Copies of the hosts' latest samples and the latest metrics record, for rendering."""
        with self.lock:
            hosts = [HostState(s.node, s.host, dict(s.gpus), s.seen, s.waited) for s in self.hosts.values()]
            return hosts, self.metrics

    def rank_records(self) -> dict[int, dict[str, Any]]:
        """A copy of each rank's latest metrics record, by rank."""
        with self.lock:
            return dict(self.ranks)

    def _episode(self, node: str, gpu: int | None, rule: str) -> AlertEpisode:
        return self.episodes.setdefault((node, gpu, rule), AlertEpisode())

    def _gpu_alerts(self, state: HostState, sample: dict[str, Any], now: float) -> list[Alert]:
        node, gpu, rules = state.node, int(sample["gpu"]), self.rules
        name = f"gpu{gpu}"
        fired = []
        util = sample.get("util")
        idle = util is not None and util < rules.idle_util_pct and _job_uses(state, gpu)
        if self._episode(node, gpu, "idle").update(idle, now, rules.idle_after_s):
            fired.append(Alert(node, "idle", f"{name} idle for {rules.idle_after_s:g} s "
                               f"(utilisation {util}% < {rules.idle_util_pct:g}%)", figures={"gpu": gpu, "util": util}))
        pct = mem_pct(sample)
        if self._episode(node, gpu, "memory").update(pct is not None and pct > rules.mem_pct, now, 0):
            fired.append(Alert(node, "memory", f"{name} memory {pct:.0f}% full "
                               f"({sample['mem_used_mb'] / 1024:.1f} of {sample['mem_total_mb'] / 1024:.1f} GB)",
                               figures={"gpu": gpu, "mem_pct": round(pct or 0.0, 1)}))
        reasons = sorted(set(sample.get("throttle") or ()) & rules.throttle_reasons)
        if self._episode(node, gpu, "throttle").update(bool(reasons), now, rules.throttle_after_s):
            fired.append(Alert(node, "throttle", f"{name} clocks throttled ({', '.join(reasons)}) for "
                               f"{rules.throttle_after_s:g} s: {temp_text(sample.get('temp_c'))}, "
                               f"{power_text(sample.get('power_w'), sample.get('power_limit_w'))}",
                               figures={"gpu": gpu, "reasons": reasons}))
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
                                   f"({value} in all{extra})",
                                   figures={"gpu": gpu, "new": value - before, "all": value}))
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


def host_evidence(state: HostState | None) -> str:
    """What the latest sample of a host says of it, for a straggler alert: `node2 now: load 5.1, cpu 98%,
    job cpu 38%, memory 41%, gpu0 1410 MHz throttle hw_slowdown, XID 79`; "" without a sample."""
    if state is None or state.host is None:
        return ""
    host = state.host
    parts = [f"load {host['load1']:.1f}" if host.get("load1") is not None else "",
             f"cpu {host['cpu_pct']:.0f}%" if host.get("cpu_pct") is not None else "",
             f"job cpu {host['job_cpu_pct']:.0f}%" if host.get("job_cpu_pct") is not None else "",
             f"memory {pct:.0f}%" if (pct := mem_pct(host)) is not None else ""]
    for index, gpu in sorted(state.gpus.items()):
        throttle = [r for r in gpu.get("throttle") or () if r != "gpu_idle"]
        said = [f"{gpu['sm_clock_mhz']} MHz" if gpu.get("sm_clock_mhz") is not None else "",
                f"throttle {','.join(throttle)}" if throttle else "", f"XID {gpu['xid']}" if gpu.get("xid") else ""]
        parts.append(" ".join([f"gpu{index}", *filter(None, said)]) if any(said) else "")
    return f"{state.node} now: {', '.join(filter(None, parts))}"


def temp_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}°C"


def power_text(draw: float | None, limit: float | None) -> str:
    if draw is None:
        return "-"
    return f"{draw:.0f}/{limit:.0f} W" if limit else f"{draw:.0f} W"


def summary_lines(alerts: list[Any]) -> list[str]:
    """The alerts part of a job's final summary, from the record's alerts (objects, or older sentences)."""
    if not alerts:
        return []
    lines = [f"  alerts ({len(alerts)}):"] + [f"    {recorded(a).text()}" for a in alerts[:SUMMARY_ALERTS]]
    if len(alerts) > SUMMARY_ALERTS:
        lines.append(f"    ... and {len(alerts) - SUMMARY_ALERTS} more (`distrun ps --json`)")
    return lines


def _safe_values(value: Any) -> Any:
    """`value` with every string in it made safe for a terminal (`terminal.safe_text`)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, list):
        return [_safe_values(item) for item in value]
    if isinstance(value, dict):
        return {key: _safe_values(item) for key, item in value.items()}
    return value
