"""Alerts as data (issue 45 item 6): the record keeps each alert's fields beside its sentence, and every
reader (the summary, `top`, `ps --json`, the report, `/metrics`) reads the fields, never the sentence;
a job recorded by an older distrun (sentences only) still reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.metrics import JobFigures, exposition
from orchestrator.metrics import figures as metric_figures
from orchestrator.report.page import alerts_list
from orchestrator.store import JobRecord, JobState, Store
from orchestrator.telemetry.alerts import Alert, recorded, summary_lines
from orchestrator.telemetry.view import _caption

REPO = Path(__file__).resolve().parents[1]
NEW = Alert("node2", "straggler", "straggler: rank 4 on node2 enters all_reduce 180 ms after the others; node2 now: "
            "load 5.1", t=1_790_000_000.0, rank=4, figures={"late_ms": 180.0, "op": "all_reduce"},
            evidence="node2 now: load 5.1")
OLD = ["14:02:11 node1: gpu0 idle for 60 s (utilisation 0% < 5%)",
       "14:02:12 node1: gpu1: 1 new XID error(s) (1 in all, last XID 79)",
       "14:02:13 node0: straggler: rank 3 takes 0.900 s a step, 3.0x the median 0.300 s of all ranks",
       "14:02:14 node2: no telemetry samples for 7 s since the last (expected every 2 s)",
       "14:02:15 node2: gpu0 memory 97% full (77.6 of 80.0 GB)",
       "14:02:16 node2: stall: no progress from any rank for 30 s",
       "something an even older distrun wrote"]


def test_an_alert_is_recorded_with_its_fields_and_read_back_whole() -> None:
    record = NEW.record()
    assert record == {"t": 1_790_000_000.0, "node": "node2", "rule": "straggler", "rank": 4,
                      "message": NEW.message, "figures": {"late_ms": 180.0, "op": "all_reduce"},
                      "evidence": "node2 now: load 5.1"}
    assert recorded(json.loads(json.dumps(record))) == NEW


def test_an_older_records_sentences_read_to_their_host_time_rule_and_rank_without_a_pattern() -> None:
    read = [recorded(line) for line in OLD]
    assert [a.rule for a in read] == ["idle", "xid", "straggler", "silent", "memory", "stall", "other"]
    assert [(a.node, a.rank) for a in read[:3]] == [("node1", None), ("node1", None), ("node0", 3)]
    assert [a.text() for a in read[:-1]] == OLD[:-1]
    assert read[-1].message == OLD[-1] and read[-1].node == ""
    assert not hasattr(metric_figures, "re"), "no regular expression reads an alert back"


def test_the_summary_the_report_top_and_metrics_read_new_and_old_alerts_alike() -> None:
    entries = [NEW.record(), *OLD]
    lines = summary_lines(entries)
    assert lines[1].endswith("node2: " + NEW.message) and lines[2] == "    " + OLD[0]
    assert "rank 4 on node2" in str(_caption(None, entries[:1])) and "14:02:16" in str(_caption(None, entries[:7]))
    record = JobRecord("j", "j", "", "", ["node0"], alerts=entries)
    assert "straggler: rank 4 on node2" in alerts_list(record) and "gpu0 idle for 60 s" in alerts_list(record)
    text = exposition([JobFigures("j", "running", 1, [], alerts=entries)])
    found = {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text)
             for s in f.samples}
    assert found[("distrun_job_alerts_total", frozenset({("job", "j"), ("kind", "straggler")}))] == 2
    assert found[("distrun_job_alerts_total", frozenset({("job", "j"), ("kind", "other")}))] == 1
    named = {k[1] for k in found if k[0] == "distrun_rank_straggler_named_total"}
    assert named == {frozenset({("job", "j"), ("host", "node2"), ("rank", "4")}),
                     frozenset({("job", "j"), ("host", "node0"), ("rank", "3")})}


def test_ps_json_gives_each_alerts_fields_and_an_older_jobs_sentences(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home)
    for job, alerts in (("new-1", [NEW.record()]), ("old-1", OLD[:1])):
        store.save(JobRecord(job, job, "", "", ["node0"], state=JobState.SUCCEEDED, alerts=alerts))
    result = subprocess.run([sys.executable, "-m", "orchestrator", "ps", "--json", "--all"], cwd=REPO,
                            env={"DISTRUN_HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    by_id = {rec["id"]: rec["alerts"] for rec in json.loads(result.stdout)}
    assert by_id["new-1"] == [NEW.record()] and by_id["old-1"] == OLD[:1]
    shown = subprocess.run([sys.executable, "-m", "orchestrator", "ps", "--all"], cwd=REPO,
                           env={"DISTRUN_HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert shown.stdout.count("alerts=1") == 2
