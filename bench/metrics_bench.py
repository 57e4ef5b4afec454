"""The cost of a job's /metrics endpoint at 244 hosts x 8 GPUs (simulated samples, no network).

Measures, on this machine:
- one scrape: the collector's snapshot, the metric families and the text exposition
  (prometheus_client's `generate_latest`), and the same through the real HTTP endpoint;
- the series count;
- how long a scrape holds the aggregator's lock (the only thing the run loop's `observe` can wait
  for): the snapshot's copy of every host's latest samples and every rank's latest record;
- the run loop's `observe` per sample, alone and while a thread scrapes back to back.

Usage: .venv/bin/python bench/metrics_bench.py [--hosts 244] [--gpus 8] [--rounds 30] [--out bench/results/metrics.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

from orchestrator.metrics import JobFigures, bind
from orchestrator.metrics.families import registry_of
from orchestrator.telemetry.alerts import Aggregator


def host_sample(node: str, t: float) -> dict:
    return {"kind": "host", "t": t, "host": node, "interval": 2.0, "cpus": 96, "cpu_pct": 63.2, "load1": 40.1,
            "mem_used_mb": 812_000, "mem_total_mb": 2_015_000, "net_rx_bytes": 10**12, "net_tx_bytes": 10**12,
            "net_rx_bps": 1.2e9, "net_tx_bps": 1.1e9, "job_procs": 9, "job_cpu_pct": 812.0, "job_rss_mb": 120_000}


def gpu_sample(node: str, gpu: int, t: float) -> dict:
    return {"kind": "gpu", "t": t, "host": node, "gpu": gpu, "source": "nvml", "util": 97, "mem_used_mb": 71_000,
            "mem_total_mb": 81_559, "temp_c": 67, "power_w": 611.0, "power_limit_w": 700.0, "sm_clock_mhz": 1980,
            "throttle": ["sw_power_cap"] if gpu == 0 else [], "ecc_uncorrected": 0, "xid": 0, "xid_last": None,
            "job_mem_mb": 70_500}


def filled(hosts: int, gpus: int) -> Aggregator:
    """An aggregator holding every host's and GPU's latest sample and every rank's latest record."""
    nodes = [f"node{i:03d}" for i in range(hosts)]
    aggregator = Aggregator(nodes, 2.0)
    now = time.time()
    for index, node in enumerate(nodes):
        aggregator.observe(node, host_sample(node, now), at=now)
        for gpu in range(gpus):
            aggregator.observe(node, gpu_sample(node, gpu, now), at=now)
            rank = index * gpus + gpu
            aggregator.observe_metrics({"t": now, "node": node, "rank": rank, "step": 1200, "step_time_s": 0.41,
                                        "busy_s": 0.38, "samples_per_s": 78.0})
    return aggregator


class Timed:
    """The figures source as the launch's LiveFigures takes them, timing the part under the lock."""

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self.held: list[float] = []

    def __call__(self) -> list[JobFigures]:
        started = time.perf_counter()
        hosts, throughput = self.aggregator.snapshot()
        ranks = self.aggregator.rank_records()
        self.held.append(time.perf_counter() - started)
        return [JobFigures("bench-1", "running", 1, hosts, ranks=ranks, throughput=throughput)]


def observe_times(aggregator: Aggregator, node: str, count: int) -> list[float]:
    """Seconds per `observe` of one GPU sample (the run loop's work per sample)."""
    times = []
    for i in range(count):
        sample = gpu_sample(node, i % 8, time.time())
        started = time.perf_counter()
        aggregator.observe(node, sample)
        times.append(time.perf_counter() - started)
    return times


def ms(value: float) -> str:
    return f"{value * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=244)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    aggregator = filled(args.hosts, args.gpus)
    source = Timed(aggregator)
    registry = registry_of(source)
    load_before = os.getloadavg()
    text = generate_latest(registry)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    scrapes = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        generate_latest(registry)
        scrapes.append(time.perf_counter() - started)
    endpoint = bind("127.0.0.1", 0, source)
    http = []
    try:
        for _ in range(args.rounds):
            started = time.perf_counter()
            with urllib.request.urlopen(endpoint.url, timeout=30) as reply:
                size = len(reply.read())
            http.append(time.perf_counter() - started)
    finally:
        endpoint.close()
    node = f"node{0:03d}"
    alone = observe_times(aggregator, node, 20_000)
    stop = threading.Event()

    def scrape_forever() -> None:
        while not stop.is_set():
            generate_latest(registry)

    scraper = threading.Thread(target=scrape_forever, daemon=True)
    scraper.start()
    busy = observe_times(aggregator, node, 20_000)
    stop.set()
    scraper.join()
    held = source.held
    load_after = os.getloadavg()

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))]

    lines = [
        "# The cost of a job's /metrics endpoint",
        "",
        f"Command: `.venv/bin/python bench/metrics_bench.py --hosts {args.hosts} --gpus {args.gpus} "
        f"--rounds {args.rounds}`",
        "",
        f"Machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; shared with "
        "other engineers' builds and tests while it ran (load average 1, 5, 15 min before: "
        f"{', '.join(f'{v:.2f}' for v in load_before)}; after: {', '.join(f'{v:.2f}' for v in load_after)}), so "
        "every time here is an upper bound of the code's own.",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Simulated: {args.hosts} hosts x {args.gpus} GPUs, each with a full sample (every field the sampler "
        f"writes), and {args.hosts * args.gpus} ranks each with a metrics record; one job.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| series in one scrape | {series} |",
        f"| exposition size | {len(text) / 1024:.0f} KB ({size / 1024:.0f} KB over HTTP) |",
        f"| one scrape, collect + exposition (`generate_latest`), median / max of {args.rounds} | "
        f"{ms(statistics.median(scrapes))} / {ms(max(scrapes))} ms |",
        f"| one scrape through the HTTP endpoint (urllib client, same machine), median / max | "
        f"{ms(statistics.median(http))} / {ms(max(http))} ms |",
        f"| lock held per scrape (snapshot of hosts + ranks), median / max of {len(held)} | "
        f"{ms(statistics.median(held))} / {ms(max(held))} ms |",
        f"| run loop's `observe` per GPU sample, alone: median / p99 | "
        f"{statistics.median(alone) * 1e6:.1f} / {pct(alone, 0.99) * 1e6:.1f} µs |",
        f"| the same while a thread scrapes back to back: median / p99 / max | "
        f"{statistics.median(busy) * 1e6:.1f} µs / {pct(busy, 0.99) * 1e6:.1f} µs / {max(busy) * 1e3:.2f} ms |",
        "",
        "The scrape runs in prometheus_client's server thread; the run loop shares with it only the "
        "aggregator's lock, held for the snapshot's shallow copies (the row above), and the interpreter's GIL "
        "(a scrape back to back, far more often than any Prometheus asks, is the worst case of the last row).",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
