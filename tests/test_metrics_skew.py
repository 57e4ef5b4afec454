"""Per-collective arrival skew on /metrics (issue 45 item 5): a histogram of how long after the first rank
the last one entered each collective, and the rank each came last on, from real Flight Recorder records
(tests/data/flight: rank 2 entering each step's first all_reduce 200 ms after the others)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.metrics import JobFigures, exposition
from orchestrator.telemetry.view import Monitor
from tests.test_flight_stragglers import events

DASHBOARD = Path(__file__).resolve().parents[1] / "grafana" / "distrun-job.json"


def test_the_skew_histogram_and_the_last_ranks_show_the_straggler() -> None:
    monitor = Monitor(["node0", "node1", "node2"], None, lambda alerts: None, lambda node: True, "job", world_size=3)
    for node, event in events("late2"):
        monitor.flight(node, event)
    progress = monitor.progress_now()
    assert progress["skew"]["count"] == monitor.late.judged  # every judged collective, once
    text = exposition([JobFigures("job", "running", 1, [], progress=progress)])
    found = {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text)
             for s in f.samples}
    job = ("job", "job")
    count = found[("distrun_collective_arrival_skew_seconds_count", frozenset({job}))]
    assert count == progress["skew"]["count"] == found[
        ("distrun_collective_arrival_skew_seconds_bucket", frozenset({job, ("le", "+Inf")}))]
    late = found[("distrun_collective_arrival_skew_seconds_bucket", frozenset({job, ("le", "0.25")}))] - found[
        ("distrun_collective_arrival_skew_seconds_bucket", frozenset({job, ("le", "0.1")}))]
    assert late >= count * 0.45  # a step's first all_reduce of two: rank 2 is 200 ms late in half of them
    lasts = {dict(k[1])["rank"]: v for k, v in found.items() if k[0] == "distrun_rank_collectives_last_total"}
    assert max(lasts, key=lasts.get) == "2" and {dict(k[1])["host"] for k in found
                                                  if k[0] == "distrun_rank_collectives_last_total"} <= {
        "node0", "node1", "node2"}


def test_the_dashboard_has_the_skew_panel() -> None:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    exprs = [t["expr"] for p in panels.values() for t in p.get("targets", ())]
    assert any("distrun_collective_arrival_skew_seconds_bucket" in e for e in exprs)
    assert any("distrun_rank_collectives_last_total" in e for e in exprs)
