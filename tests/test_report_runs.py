"""The report of a program that prints nothing for distrun: wall time, collective and step rate, the
rate and each rank's lateness over time from its ranks' Flight Recorders; no plot drawn without
data (a line says what would fill it); what is missing said; the two throughputs told apart."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest

from orchestrator.report.numbers import JobData, summarize
from orchestrator.report.page import render
from orchestrator.report.runs import HEAT_BINS, run_figures
from orchestrator.report.timeline import place, progress_points, rate_series, read_rounds
from orchestrator.store import JobState, Store
from tests.test_report import make_job, metric_rows
from tests.test_trace import RECORDED, T0, recorded_job, synthetic_job, synthetic_rows


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    return Store()


def load(store: Store, record) -> JobData:
    return JobData.load(record, store.job_dir(record.id))


def images(page: str) -> list[str]:
    return re.findall(r'<img src="data:image/svg\+xml;base64,[^"]+" alt="([^"]+)"', page)


def runs_row(page: str, job_id: str) -> list[str]:
    row = re.search(rf"<tr data-job={re.escape(job_id)}><td><span class=id>.*?</tr>", page)
    assert row, page
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))]


def test_a_real_run_of_a_program_that_prints_nothing_for_distrun_gets_its_rates_and_no_empty_plot(store):
    record = recorded_job(store)
    page = render([load(store, record)])

    rows = [json.loads(line) for line in (RECORDED / "collectives.jsonl").read_text().splitlines()]
    rank0 = sorted(c for row in rows for c in row["ranks"].get("0", {}).get("c", []))
    rate = (rank0[-1][0] - rank0[0][0]) / ((rank0[-1][2] - rank0[0][2]) / 1e6)
    # 10 steps of one all-reduce (the model is one DDP bucket), then rank 0's broadcast: a period of 11.
    assert [c[1] for c in rank0[-11:]].count("broadcast") == 1
    assert runs_row(page, record.id) == [record.id, "44.0", "726", f"{rate:.1f}", "11", f"{rate / 11:.2f}", "nothing"]
    assert images(page) == [f"collective rate of {record.id}", f"lateness of {record.id}", f"telemetry of {record.id}"]
    assert "No throughput, loss or memory plot where no job has the numbers" in page
    assert "the program prints no DISTRUN_METRICS lines: its wall time and collective rate are under Runs" in page


def test_the_rate_is_counted_by_sequence_id_and_the_step_is_the_period_of_the_collectives(store):
    rows = synthetic_rows(3, 2, 2000, late={4: 0.040, 5: 0.040}, every=400, step_s=0.05)
    record = synthetic_job(store, "late", rows, 3, 2,
                           alerts=[{"t": T0 + 50, "node": "node2", "rule": "straggler", "rank": 5,
                                    "message": "straggler: rank 5", "figures": {}}])
    run = run_figures(load(store, record), store.job_dir(record.id))

    assert run.rate == pytest.approx(20.0) and run.period == 4 and run.steps_per_s == pytest.approx(5.0)
    assert run.collectives == 2000 and run.ranks == list(range(6)) and len(run.heat[0]) == HEAT_BINS
    means = [sum(v for v in row if not math.isnan(v)) / len([v for v in row if not math.isnan(v)]) for row in run.heat]
    assert means[:4] == [0.0] * 4 and means[4:] == [pytest.approx(40.0, abs=0.01)] * 2
    assert [(e.kind, e.rank, e.t) for e in run.events] == [("straggler", 5, pytest.approx(55.0))]
    assert [r for _, r in run.rate_series] == [pytest.approx(400 / 20)] * 4


def test_the_progress_of_a_round_is_taken_once_all_its_ranks_are_read():
    rows = synthetic_rows(1, 2, 800, late={}, every=400)
    reads = place(read_rounds(rows)).reads

    assert progress_points(reads) == [(rows[0]["t"], 400), (rows[1]["t"], 800)]
    assert rate_series(reads) == [(rows[1]["t"], pytest.approx(20.0))]


def test_a_job_without_flight_recorder_says_why_it_has_no_rate_plots(store):
    record = synthetic_job(store, "nofr", None, 2, 2, worker=False)
    page = render([load(store, record)])

    cells = runs_row(page, record.id)
    assert cells[2:6] == ["—"] * 4
    assert cells[6] == ("no collectives: the job ran with `flight_recorder: false`, so no rank's Flight Recorder "
                        "was read")
    assert "No collective rate or lateness plot for job <span class=id>nofr</span>" in page
    assert images(page) == ["telemetry of nofr"]


def test_a_running_job_shows_its_wall_time_so_far(store):
    record = synthetic_job(store, "going", synthetic_rows(1, 2, 400, late={}), 1, 2, state=JobState.RUNNING)
    page = render([load(store, record)])

    assert runs_row(page, record.id)[1].endswith(" so far")
    assert "the job is running: what it recorded so far" in page


def test_the_two_throughputs_of_one_job_each_say_what_they_are(store):
    record = make_job(store, "ddp-a1", [("node0", 2)], metric_rows("ddp", 2, rate=90.0))
    data = load(store, record)
    page = render([data])

    assert summarize(data).summary_throughput == 12345.0
    assert "the launch summary&#x27;s 12345.0 samples/s: steady-state samples divided by their total time" in page
    assert "throughput: the mean of 4 steady-state interval(s)" in page


def test_alerts_kept_as_data_read_as_lines_beside_older_ones(store):
    alerts = ["14:02:11 node1: gpu0 idle for 60 s", {"t": T0, "node": "node2", "rule": "straggler", "rank": 4,
                                                      "message": "straggler: rank 4 on node2", "figures": {"x": 1}}]
    record = synthetic_job(store, "alerts", None, 3, 2, alerts=alerts)
    page = render([load(store, record)])

    items = re.findall(r"<li>(.*?)</li>", page)
    assert items[0] == "14:02:11 node1: gpu0 idle for 60 s"
    assert re.fullmatch(r"\d\d:\d\d:\d\d node2: straggler: rank 4 on node2", items[1]), items
    assert json.dumps(alerts[1]) not in page
