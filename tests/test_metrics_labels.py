"""A DISTRUN_METRICS line sets no Prometheus label (issue 46 item 7): the host and rank labels come from
where the line came from (its host's stream, its rank's framing), never from the line's own keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.logs import LogSink
from orchestrator.metrics import JobFigures, exposition
from orchestrator.remote.stream import Batch
from orchestrator.store import JobDir
from orchestrator.telemetry.view import Monitor


def test_a_lines_own_node_and_rank_keys_label_nothing(tmp_path: Path) -> None:
    monitor = Monitor(["node0", "node1"], None, lambda alerts: None, lambda node: True, "job", world_size=4)
    kept: list[dict[str, Any]] = []

    def on_metrics(node: str, _rank: int | None, record: dict[str, Any]) -> None:
        kept.append(record)
        monitor.metrics(node, record)

    sink = LogSink(JobDir(tmp_path), on_metrics=on_metrics)
    line = b'DISTRUN_METRICS {"step": 3, "node": "evil\\"}", "rank": 9999, "busy_s": 0.5}\n'
    sink.batch("node1", Batch(2, "o", 1, line))
    sink.close()
    assert [(r["node"], r["rank"]) for r in kept] == [("node1", 2)]
    stored = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["node"], r["rank"]) for r in stored] == [("node1", 2)]
    figures = JobFigures("job", "running", 1, [], ranks=monitor.aggregator.rank_records())
    labels = {frozenset(s.labels.items()) for family in text_string_to_metric_families(exposition([figures]))
              if family.name == "distrun_rank_busy_seconds" for s in family.samples}
    assert labels == {frozenset({"job": "job", "host": "node1", "rank": "2"}.items())}
