"""The metric families of some jobs' figures: a prometheus_client `Collector` that builds them from
`JobFigures` snapshots at each scrape, and the same families as text or JSON for `distrun metrics`.

Names follow Prometheus' conventions: base units in the name (`_bytes`, `_seconds`, `_watts`,
`_hertz`, `_celsius`), `_total` for counters, `_ratio` for 0-1. Labels are `job`, `host`, and
`gpu`, `rank`, `state`, `kind` or `reason` where they apply: each is bounded by the job's hosts,
GPUs, ranks or a fixed list, never by its lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.metrics.figures import ALERT_KINDS, JobFigures
from orchestrator.store import JobState
from orchestrator.telemetry.alerts import recorded

MB = 1024 * 1024
STATES = tuple(state.value for state in JobState)
Source = Callable[[], Sequence[JobFigures]]
Scale = Callable[[Any], float]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(value: Any) -> float:
    return float(value)


def _pct(value: Any) -> float:
    return float(value) / 100.0


def _mb(value: Any) -> float:
    return float(value) * MB


def _mhz(value: Any) -> float:
    return float(value) * 1e6


# (metric name, help, sample key, scale, counter): one series per host or GPU that has the key.
HOST_FIGURES = (
    ("distrun_host_cpu_ratio", "Whole-host CPU busy over the last sample interval, 0-1 (all CPUs)", "cpu_pct",
     _pct, False),
    ("distrun_host_cpus", "Logical CPUs of the host", "cpus", _same, False),
    ("distrun_host_load1", "1-minute load average", "load1", _same, False),
    ("distrun_host_memory_used_bytes", "Host memory in use (MemTotal - MemAvailable)", "mem_used_mb", _mb, False),
    ("distrun_host_memory_total_bytes", "Host memory (MemTotal)", "mem_total_mb", _mb, False),
    ("distrun_host_network_receive_bytes", "Bytes received on every interface but lo", "net_rx_bytes", _same, True),
    ("distrun_host_network_transmit_bytes", "Bytes sent on every interface but lo", "net_tx_bytes", _same, True),
    ("distrun_host_job_processes", "The job's processes found on the host", "job_procs", _same, False),
    ("distrun_host_job_cpu_cores", "CPUs the job's processes kept busy (2 = two CPUs)", "job_cpu_pct", _pct, False),
    ("distrun_host_job_resident_memory_bytes", "Resident memory of the job's processes", "job_rss_mb", _mb, False),
    ("distrun_host_sample_timestamp_seconds", "When the host's latest sample was taken (epoch)", "t", _same, False),
)
GPU_FIGURES = (
    ("distrun_gpu_utilization_ratio", "Share of the last sample period in which a kernel ran, 0-1", "util",
     _pct, False),
    ("distrun_gpu_memory_used_bytes", "GPU memory in use", "mem_used_mb", _mb, False),
    ("distrun_gpu_memory_total_bytes", "GPU memory", "mem_total_mb", _mb, False),
    ("distrun_gpu_job_memory_bytes", "GPU memory held by the job's processes", "job_mem_mb", _mb, False),
    ("distrun_gpu_power_watts", "Power draw", "power_w", _same, False),
    ("distrun_gpu_power_limit_watts", "Power limit", "power_limit_w", _same, False),
    ("distrun_gpu_temperature_celsius", "GPU temperature", "temp_c", _same, False),
    ("distrun_gpu_sm_clock_hertz", "SM clock", "sm_clock_mhz", _mhz, False),
    ("distrun_gpu_ecc_uncorrected_errors", "Uncorrectable ECC errors since the driver loaded", "ecc_uncorrected",
     _same, True),
    ("distrun_gpu_xid_errors", "XID critical errors since the host's sampler started (NVML only)", "xid", _same, True),
    ("distrun_gpu_last_xid", "The last XID code seen", "xid_last", _same, False),
)
RANK_FIGURES = (
    ("distrun_rank_steps", "Optimizer steps the rank finished (its latest metrics line's step)", "step", _same, True),
    ("distrun_rank_step_seconds", "Mean wall seconds per step over the rank's last logging interval", "step_time_s",
     _same, False),
    ("distrun_rank_busy_seconds", "Mean seconds per step the rank worked, without waiting for the others",
     "busy_s", _same, False),
    ("distrun_rank_samples_per_second", "The rank's samples per second over its last interval", "samples_per_s",
     _same, False),
)


def _family(name: str, text: str, labels: list[str], counter: bool) -> Metric:
    if counter:
        return CounterMetricFamily(name, text, labels=labels)
    return GaugeMetricFamily(name, text, labels=labels)


def _sample_families(jobs: Sequence[JobFigures], table: Sequence[tuple[str, str, str, Scale, bool]],
                     labels: list[str], rows: Callable[[JobFigures], Iterable[tuple[list[str], Mapping[str, Any]]]]
                     ) -> Iterator[Metric]:
    """One family per figure of `table`, a series for each row (labels, sample) that has its key."""
    built = [(_family(name, text, labels, counter), key, scale) for name, text, key, scale, counter in table]
    for job in jobs:
        for values, sample in rows(job):
            for family, key, scale in built:
                value = sample.get(key)
                if _number(value):
                    family.add_metric(values, scale(value))
    yield from (family for family, _, _ in built)


def _host_rows(job: JobFigures) -> Iterator[tuple[list[str], Mapping[str, Any]]]:
    for host in job.hosts:
        if host.host is not None:
            yield [job.job, host.node], host.host


def _gpu_rows(job: JobFigures) -> Iterator[tuple[list[str], Mapping[str, Any]]]:
    for host in job.hosts:
        for index in sorted(host.gpus):
            yield [job.job, host.node, str(index)], host.gpus[index]


def _rank_rows(job: JobFigures) -> Iterator[tuple[list[str], Mapping[str, Any]]]:
    for rank in sorted(job.ranks):
        record = job.ranks[rank]
        yield [job.job, str(record.get("node") or ""), str(rank)], record


def _job_families(jobs: Sequence[JobFigures]) -> Iterator[Metric]:
    """The job-wide families: state, attempt, restarts, hosts, lost, quarantined, alerts, stragglers, throughput."""
    state = GaugeMetricFamily("distrun_job_state", "1 for the job's state, 0 for the others", labels=["job", "state"])
    attempt = GaugeMetricFamily("distrun_job_attempt", "The attempt running (1, 2, ...)", labels=["job"])
    restarts = CounterMetricFamily("distrun_job_restarts", "Restarts of the whole job by the controller",
                                   labels=["job"])
    hosts = GaugeMetricFamily("distrun_job_hosts", "Hosts of the attempt running", labels=["job"])
    lost = CounterMetricFamily("distrun_job_hosts_lost", "Attempts that ended with a host lost", labels=["job"])
    quarantined = GaugeMetricFamily("distrun_job_hosts_quarantined", "Hosts set aside for the rest of the job",
                                    labels=["job"])
    aside = GaugeMetricFamily("distrun_host_quarantined", "1 for each host set aside for the rest of the job",
                              labels=["job", "host"])
    alerts = CounterMetricFamily("distrun_job_alerts", "Alerts raised, by kind", labels=["job", "kind"])
    stragglers = CounterMetricFamily("distrun_rank_straggler_named", "Times the rank was named a straggler",
                                     labels=["job", "host", "rank"])
    rate = GaugeMetricFamily("distrun_job_samples_per_second", "The job's latest throughput (rank 0's metrics line)",
                             labels=["job"])
    for job in jobs:
        for name in STATES:
            state.add_metric([job.job, name], 1.0 if name == job.state else 0.0)
        attempt.add_metric([job.job], job.attempt)
        restarts.add_metric([job.job], job.attempt - 1)
        hosts.add_metric([job.job], len(job.hosts))
        lost.add_metric([job.job], job.hosts_lost)
        quarantined.add_metric([job.job], len(job.quarantined))
        for node in job.quarantined:
            aside.add_metric([job.job, node], 1.0)
        kinds = dict.fromkeys(ALERT_KINDS, 0)
        named: dict[tuple[str, int], int] = {}
        for entry in job.alerts:
            alert = recorded(entry)
            kinds[alert.rule if alert.rule in kinds else "other"] += 1
            if alert.rule == "straggler" and alert.rank is not None:
                named[(alert.node, alert.rank)] = named.get((alert.node, alert.rank), 0) + 1
        for kind, count in kinds.items():
            alerts.add_metric([job.job, kind], count)
        for (node, rank), count in sorted(named.items()):
            stragglers.add_metric([job.job, node, str(rank)], count)
        value = (job.throughput or {}).get("samples_per_s", (job.throughput or {}).get("mean_samples_per_s"))
        if _number(value):
            rate.add_metric([job.job], float(value))
    yield from (state, attempt, restarts, hosts, lost, quarantined, aside, alerts, stragglers, rate)
    yield from _progress_families(jobs)


def _progress_families(jobs: Sequence[JobFigures]) -> Iterator[Metric]:
    """The job's progress from its ranks' Flight Recorders, for a program that prints no metrics lines."""
    rate = GaugeMetricFamily("distrun_job_collectives_per_second",
                             "Collectives the slowest rank completed per second over the last 30 s (Flight Recorder)",
                             labels=["job"])
    done = CounterMetricFamily("distrun_rank_collectives", "The rank's last completed collective (Flight Recorder)",
                               labels=["job", "rank"])
    for job in jobs:
        if _number(job.progress.get("collectives_per_s")):
            rate.add_metric([job.job], float(job.progress["collectives_per_s"]))
        for rank, seq in sorted((job.progress.get("ranks") or {}).items(), key=lambda item: int(item[0])):
            if _number(seq):
                done.add_metric([job.job, str(rank)], seq)
    yield from (rate, done)
    yield from _skew_families(jobs)


def _skew_families(jobs: Sequence[JobFigures]) -> Iterator[Metric]:
    """The collectives' arrival skew (diagnose/skew.py): a histogram, and the rank each came last on."""
    skew = HistogramMetricFamily("distrun_collective_arrival_skew_seconds",
                                 "How long after the first rank the last entered each collective (Flight Recorder)",
                                 labels=["job"])
    last = CounterMetricFamily("distrun_rank_collectives_last",
                               "Collectives the rank entered last, the others waiting for it (Flight Recorder)",
                               labels=["job", "host", "rank"])
    for job in jobs:
        found = job.progress.get("skew")
        if not isinstance(found, dict) or not found.get("buckets"):
            continue
        buckets = [(str(le) if le == "+Inf" else f"{float(le):g}", float(count)) for le, count in found["buckets"]]
        skew.add_metric([job.job], buckets, float(found.get("sum_s") or 0.0))
        for node, rank, count in found.get("last") or ():
            last.add_metric([job.job, str(node), str(rank)], count)
    yield from (skew, last)


def _throttle_family(jobs: Sequence[JobFigures]) -> Metric:
    """distrun_gpu_throttle: a series of 1 for each clock-throttle reason active on a GPU (none when none is)."""
    family = GaugeMetricFamily("distrun_gpu_throttle", "1 for each clock-throttle reason active on the GPU",
                               labels=["job", "host", "gpu", "reason"])
    for job in jobs:
        for values, sample in _gpu_rows(job):
            for reason in sorted(set(sample.get("throttle") or ())):
                family.add_metric([*values, str(reason)], 1.0)
    return family


def families(jobs: Sequence[JobFigures]) -> Iterator[Metric]:
    """Every metric family of `jobs`' figures."""
    yield from _job_families(jobs)
    yield from _sample_families(jobs, HOST_FIGURES, ["job", "host"], _host_rows)
    yield from _sample_families(jobs, GPU_FIGURES, ["job", "host", "gpu"], _gpu_rows)
    yield _throttle_family(jobs)
    yield from _sample_families(jobs, RANK_FIGURES, ["job", "host", "rank"], _rank_rows)


class JobsCollector(Collector):
    """A prometheus_client collector of the jobs `source` gives at each scrape (a snapshot each)."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from families(self.source())


def registry_of(jobs: Sequence[JobFigures] | Source) -> CollectorRegistry:
    """A registry with nothing but the jobs' collector (no process or platform metrics of this Python)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(jobs if callable(jobs) else lambda: jobs))
    return registry


def exposition(jobs: Sequence[JobFigures]) -> str:
    """The jobs' figures in Prometheus' text exposition format ('' for no job)."""
    return generate_latest(registry_of(jobs)).decode("utf-8") if jobs else ""


def families_json(jobs: Sequence[JobFigures]) -> list[dict[str, Any]]:
    """The jobs' figures as JSON-ready data: a family each, with its samples' names, labels and values."""
    return [{"name": family.name, "type": family.type, "help": family.documentation,
             "samples": [{"name": s.name, "labels": dict(s.labels), "value": s.value} for s in family.samples]}
            for family in families(jobs) if family.samples]
