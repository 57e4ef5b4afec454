"""The comparison report from synthetic job directories: its numbers, its wording, its HTML."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.errors import UsageError
from orchestrator.report.numbers import JobData, host_efficiency, load_jobs, pick_baseline, scaling_series, summarize
from orchestrator.report.page import render, write_report
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun

T0 = 1_700_000_000.0


# ---------------------------------------------------------------- synthetic jobs


def metric_rows(strategy: str, world: int, *, steps: int = 12, every: int = 2, warm: int = 4, rate: float = 100.0,
                device: str = "cpu", batch: int = 8, ranks: int = 1) -> list[dict[str, Any]]:
    """Records as the controller stores them: per interval and rank, then rank 0's final one."""
    rows = []
    for step in range(every, steps + 1, every):
        for rank in range(ranks):
            wobble = 1.0 + 0.07 * math.sin(step + rank)
            rows.append({
                "t": T0 + step, "node": "node0", "rank": rank, "step": step, "warmup": step <= warm,
                "samples_per_s": rate * world * wobble * (0.5 if step <= warm else 1.0),
                "step_time_s": batch / (rate * wobble), "loss": 7.0 - step * rate / 1000,
                "peak_mem_mb": 500.0 + 13 * rank + step,
                "world_size": world, "global_batch": batch * world, "strategy": strategy, "device": device,
                "amp": None if device == "cpu" else "bfloat16",
            })
    rows.append({"t": T0 + steps + 1, "node": "node0", "rank": 0, "final": True, "step": steps,
                 "mean_samples_per_s": 12345.0, "peak_mem_mb": 999.5, "strategy": strategy})
    return rows


def host_samples(nodes: list[str], count: int = 6) -> list[dict[str, Any]]:
    return [{"node": node, "kind": "host", "t": T0 + i, "cpu_pct": 20.0 + 10 * i + n, "mem_used_mb": 1000.0 + 50 * i,
             "mem_total_mb": 8000.0, "job_cpu_pct": 150.0, "job_rss_mb": 700.0}
            for i in range(count) for n, node in enumerate(nodes)]


def plan_doc(job_id: str, hosts: list[tuple[str, int]], secret: bool = False) -> dict[str, Any]:
    docs = []
    for rank, (node, nproc) in enumerate(hosts):
        env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
        if secret:
            env["API_TOKEN"] = "***"
        docs.append({
            "node": node, "host": f"10.0.0.{10 + rank}", "node_rank": rank, "nproc": nproc,
            "python": "/opt/venv/bin/python", "workdir": "/srv/project", "env": env,
            "secret_names": ["API_TOKEN"] if secret else [], "iface": "eth0",
            "argv": ["/opt/venv/bin/python", "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                     "--nproc-per-node", str(nproc), "jobs/train_resnet50.py", "--steps", "12"],
        })
    return {"job_id": job_id, "hosts": docs, "nnodes": len(hosts), "world_size": sum(n for _, n in hosts)}


def make_job(store: Store, job_id: str, hosts: list[tuple[str, int]], metrics: list[dict[str, Any]], *,
             telemetry: list[dict[str, Any]] | None = None, facts: dict[str, Any] | None = None,
             state: JobState = JobState.SUCCEEDED, detail: str = "", secret: bool = False,
             raw_metrics: str = "", failures: list[dict[str, Any]] | None = None) -> JobRecord:
    """A recorded job with plan.json, metrics.jsonl and, when given, telemetry.jsonl and facts.json."""
    record = JobRecord(id=job_id, name=job_id.rsplit("-", 1)[0], spec_path=f"jobs/compare/{job_id}.yaml",
                       inventory="inventory/cluster.yaml", hosts=[h for h, _ in hosts], state=state,
                       started=T0 + len(store.list()), ended=T0 + 60,
                       exit_code=0 if state is JobState.SUCCEEDED else 1, detail=detail,
                       failures=failures or [])
    store.save(record)
    job_dir = store.job_dir(job_id)
    job_dir.create()
    job_dir.plan.write_text(json.dumps(plan_doc(job_id, hosts, secret)))
    job_dir.metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics) + raw_metrics)
    if telemetry is not None:
        job_dir.telemetry.write_text("".join(json.dumps(t) + "\n" for t in telemetry))
    if facts is not None:
        job_dir.facts.write_text(json.dumps(facts))
    return record


def standard_set(store: Store) -> list[JobData]:
    """single (1 process), ddp on one host (2), ddp on two hosts (2 x 2), as a bench would give."""
    facts = {"node0": {"hostname": "node0", "python": "3.11.2", "torch": "2.13.0", "gpus": 0},
             "node1": {"hostname": "node1", "python": "3.11.2", "torch": "2.13.0", "gpus": 0}}
    records = [
        make_job(store, "single-a1", [("node0", 1)], metric_rows("single", 1, rate=100.0),
                 telemetry=host_samples(["node0"]), facts={"node0": facts["node0"]}),
        make_job(store, "ddp2-b2", [("node0", 2)], metric_rows("ddp", 2, rate=90.0, ranks=2),
                 telemetry=host_samples(["node0"]), facts={"node0": facts["node0"]}),
        make_job(store, "ddp2x2-c3", [("node0", 2), ("node1", 2)], metric_rows("ddp", 4, rate=70.0),
                 telemetry=host_samples(["node0", "node1"]), facts=facts, secret=True),
    ]
    return [JobData.load(r, store.job_dir(r.id)) for r in records]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    return Store()


# ---------------------------------------------------------------- reading the page back


class TableReader(HTMLParser):
    """Rows of the `comparison` table as {job id: {column: cell text}}."""

    def __init__(self) -> None:
        super().__init__()
        self.in_table = False
        self.columns: list[str] = []
        self.rows: dict[str, dict[str, str]] = {}
        self.row: list[str] | None = None
        self.job = ""
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", "comparison") in attrs:
            self.in_table = True
        elif self.in_table and tag == "tr":
            self.row, self.job = [], dict(attrs).get("data-job") or ""
        elif self.in_table and tag in ("td", "th"):
            self.cell = []
        elif self.cell is not None and tag == "br":
            self.cell.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.in_table = False
        elif self.in_table and tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif self.in_table and tag == "tr" and self.row is not None:
            if self.job:
                self.rows[self.job] = dict(zip(self.columns, self.row, strict=True))
            else:
                self.columns = self.row
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table(page: str) -> dict[str, dict[str, str]]:
    reader = TableReader()
    reader.feed(page)
    return reader.rows


def expected_numbers(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """The definitions printed on the page, computed here without the report's code."""
    rank0 = [m for m in metrics if m["rank"] == 0 and not m.get("final")]
    steady = [m for m in rank0 if not m["warmup"]]
    step_time = sum(m["step_time_s"] for m in steady) / len(steady)
    last_step = max(m["step"] for m in rank0)
    return {
        "throughput": sum(m["samples_per_s"] for m in steady) / len(steady),
        "steps": last_step,
        "time": last_step * step_time,
        "peak": max(m["peak_mem_mb"] for m in metrics if "peak_mem_mb" in m),
        "batch": rank0[-1]["global_batch"],
    }


# ---------------------------------------------------------------- the numbers


def test_throughput_is_the_mean_of_rank0_steady_state_samples_per_s(store: Store) -> None:
    rows = metric_rows("ddp", 2, ranks=2, rate=80.0)
    data = JobData.load(make_job(store, "ddp-x", [("node0", 2)], rows), store.job_dir("ddp-x"))

    summary = summarize(data)

    steady = [r["samples_per_s"] for r in rows if r["rank"] == 0 and not r.get("final") and not r["warmup"]]
    assert len(steady) == 4
    assert summary.throughput == pytest.approx(sum(steady) / 4)
    assert summary.steady_count == 4
    assert summary.throughput != pytest.approx(12345.0)


def test_time_for_n_steps_is_the_last_step_times_the_mean_steady_step_time(store: Store) -> None:
    rows = metric_rows("single", 1, steps=20, every=5, warm=5)
    data = JobData.load(make_job(store, "s-x", [("node0", 1)], rows), store.job_dir("s-x"))

    summary = summarize(data)

    times = [r["step_time_s"] for r in rows if not r.get("final") and r["step"] > 5]
    assert summary.steps == 20
    assert summary.time_for_steps_s == pytest.approx(20 * sum(times) / len(times))


def test_peak_memory_is_the_largest_any_rank_or_the_final_record_reported(store: Store) -> None:
    rows = metric_rows("ddp", 2, ranks=2)
    data = JobData.load(make_job(store, "m-x", [("node0", 2)], rows), store.job_dir("m-x"))

    assert summarize(data).peak_mem_mb == 999.5
    rows[-1]["peak_mem_mb"] = 1.0
    data = JobData.load(make_job(store, "m-y", [("node0", 2)], rows), store.job_dir("m-y"))
    assert summarize(data).peak_mem_mb == max(r["peak_mem_mb"] for r in rows[:-1])


def test_damaged_lines_and_records_missing_keys_are_skipped(store: Store) -> None:
    rows = metric_rows("single", 1)
    rows.insert(3, {"t": T0, "node": "node0", "rank": 0, "note": "no step here"})
    rows.insert(5, {"t": T0, "node": "node0", "rank": 0, "step": 9, "warmup": False, "samples_per_s": "fast"})
    record = make_job(store, "d-x", [("node0", 1)], rows, raw_metrics="{not json\n[1, 2]\n")

    summary = summarize(JobData.load(record, store.job_dir("d-x")))

    assert summary.throughput == pytest.approx(expected_numbers(metric_rows("single", 1))["throughput"])


def test_a_job_without_metrics_has_no_numbers_but_still_a_row(store: Store) -> None:
    root = Failure("node1", FailureKind.EXIT, rank=3, exit_code=1, address="10.0.0.11", last_lines=("x",))
    detail = "job e-x FAILED (the summary is not read back: the record's failures are)"
    record = make_job(store, "e-x", [("node0", 2)], [], state=JobState.FAILED, detail=detail,
                      failures=[root.to_dict()])

    summary = summarize(JobData.load(record, store.job_dir("e-x")))
    row = table(render([JobData.load(record, store.job_dir("e-x"))]))["e-x"]

    assert summary.throughput is None and summary.steps is None and summary.world_size == 2
    assert row["Throughput (samples/s)"] == "—" and row["Hosts × processes"] == "1 × 2"
    assert ("FAILED: node1 (10.0.0.11) rank 3: exit code 1\nthe program prints no DISTRUN_METRICS lines: its wall "
            "time and collective rate are under Runs") in row["Notes"]


def test_a_job_recorded_without_failures_shows_its_summarys_first_line(store: Store) -> None:
    record = make_job(store, "s-x", [("node0", 2)], [], state=JobState.STOPPED,
                      detail="job s-x stopped (SIGINT); every host's processes ended\nmore")
    row = table(render([JobData.load(record, store.job_dir("s-x"))]))["s-x"]

    assert "STOPPED: job s-x stopped (SIGINT); every host's processes ended" in row["Notes"]


def test_scaling_efficiency_divides_by_processes_times_the_single_process_baseline(store: Store) -> None:
    data = standard_set(store)
    summaries = [summarize(d) for d in data]

    baseline = pick_baseline(summaries)
    rows = table(render(data))

    assert baseline is not None and baseline.job_id == "single-a1"
    base = expected_numbers(data[0].metrics)["throughput"]
    for job, world in (("single-a1", 1), ("ddp2-b2", 2), ("ddp2x2-c3", 4)):
        own = expected_numbers(next(d for d in data if d.record.id == job).metrics)["throughput"]
        assert rows[job]["Scaling efficiency"] == f"{100 * own / (world * base):.1f}%"
    assert rows["single-a1"]["Scaling efficiency"] == "100.0%"


def test_table_shows_each_number_of_the_metrics_files_with_fixed_decimals(store: Store) -> None:
    data = standard_set(store)

    rows = table(render(data))

    for job in data:
        want = expected_numbers(job.metrics)
        row = rows[job.record.id]
        assert row["Throughput (samples/s)"] == f"{want['throughput']:.1f}"
        assert row["Time for N steps (s)"] == f"{want['time']:.3f}"
        assert row["Steps N"] == str(want["steps"])
        assert row["Peak memory per process (MB)"] == f"{want['peak']:.1f}"
        assert row["Global batch"] == str(want["batch"])
    assert [rows[j]["Hosts × processes"] for j in ("single-a1", "ddp2-b2", "ddp2x2-c3")] == ["1 × 1", "1 × 2", "2 × 2"]


def test_page_names_the_baseline_and_says_when_there_is_none(store: Store) -> None:
    data = standard_set(store)

    assert "Baseline for scaling efficiency: <b>single</b>" in render(data)
    without = render(data[1:])
    assert "No single-process baseline in this set" in without
    assert all(r["Scaling efficiency"] == "—" for r in table(without).values())


def test_a_failed_single_process_job_is_not_the_baseline(store: Store) -> None:
    failed = make_job(store, "single-f", [("node0", 1)], metric_rows("single", 1), state=JobState.FAILED)
    ddp = make_job(store, "ddp-g", [("node0", 2)], metric_rows("ddp", 2))
    data = [JobData.load(r, store.job_dir(r.id)) for r in (failed, ddp)]

    page = render(data)

    assert "did not succeed or measured no throughput" in page
    assert 'class=failed data-job=single-f' in page


def test_dataparallel_without_gpus_says_so_in_its_row(store: Store) -> None:
    record = make_job(store, "dp-c", [("node0", 1)], metric_rows("dp", 1))

    row = table(render([JobData.load(record, store.job_dir("dp-c"))]))["dp-c"]

    assert "DataParallel ran without GPUs" in row["Notes"]


def test_dataparallel_on_gpus_counts_its_hosts_gpus_and_shows_per_gpu_memory(store: Store) -> None:
    single = make_job(store, "single-g", [("node0", 1)], metric_rows("single", 1, rate=400.0, device="cuda"))
    gpus = [{"node": "node0", "kind": "gpu", "gpu": g, "t": T0 + i, "util": 90, "mem_used_mb": 4000.0 + 3000 * (g == 0)}
            for i in range(3) for g in range(4)]
    dp = make_job(store, "dp-g", [("node0", 1)], metric_rows("dp", 1, rate=1200.0, device="cuda"), telemetry=gpus,
                  facts={"node0": {"hostname": "gpubox", "gpus": 4}})
    data = [JobData.load(r, store.job_dir(r.id)) for r in (single, dp)]

    summaries = [summarize(d) for d in data]
    row = table(render(data))["dp-g"]

    assert summaries[1].replicas == 4
    assert "device: cuda, AMP bfloat16" in row["Notes"]
    want = expected_numbers(data[1].metrics)["throughput"] / (4 * expected_numbers(data[0].metrics)["throughput"])
    assert row["Scaling efficiency"] == f"{100 * want:.1f}%"
    assert "GPU 0 holds more" in row["Notes"] and "node0/gpu0 7000.0 MB" in row["Notes"]


# ---------------------------------------------------------------- the page


def test_page_is_self_contained_with_inline_svg_plots(store: Store) -> None:
    page = render(standard_set(store))

    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"url\(", page)
    images = re.findall(r'<img src="data:image/svg\+xml;base64,', page)
    assert len(images) == 4 + 3  # throughput and memory bars, throughput and loss curves, telemetry per job


def test_a_job_without_telemetry_gets_a_sentence_instead_of_a_plot(store: Store) -> None:
    record = make_job(store, "quiet-q", [("node0", 1)], metric_rows("single", 1))

    page = render([JobData.load(record, store.job_dir("quiet-q"))])

    assert "No telemetry recorded for job <span class=id>quiet-q</span>" in page
    assert page.count("<img ") == 4


def test_each_job_lists_the_alerts_raised_while_it_ran(store: Store) -> None:
    slow = make_job(store, "slow-s", [("node0", 2)], metric_rows("ddp", 2))
    store.update("slow-s", alerts=["14:02:11 node1: straggler: rank 3 takes 0.400 s a step, 4.0x the median"])
    calm = make_job(store, "calm-c", [("node0", 1)], metric_rows("single", 1))

    page = render([JobData.load(store.get(r.id), store.job_dir(r.id)) for r in (slow, calm)])

    assert page.count("<h4>Alerts while it ran</h4>") == 1
    assert "<li>14:02:11 node1: straggler: rank 3 takes 0.400 s a step, 4.0x the median</li>" in page
    assert "Alerts while it ran: none." in page


def test_versions_come_from_facts_and_else_from_the_plan(store: Store) -> None:
    data = standard_set(store)
    bare = make_job(store, "bare-z", [("node0", 1)], metric_rows("single", 1))

    page = render(data)
    fallback = render([JobData.load(bare, store.job_dir("bare-z"))])

    assert "<th>torch</th>" in page and "<td>2.13.0</td>" in page and "<td>node1</td>" in page
    assert "No host facts (facts.json) were recorded" in fallback and "/opt/venv/bin/python" in fallback


def test_commands_reproduce_each_host_without_secret_values(store: Store) -> None:
    page = render(standard_set(store))

    assert ("cd /srv/project &amp;&amp; env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 /opt/venv/bin/python -m "
            "torch.distributed.run --nnodes 2 --nproc-per-node 2 jobs/train_resnet50.py --steps 12") in page
    assert "API_TOKEN=" not in page
    assert "secrets set from the controller&#x27;s environment: API_TOKEN" in page
    assert "distrun launch jobs/compare/ddp2x2-c3.yaml -i inventory/cluster.yaml" in page


def test_load_jobs_accepts_prefixes_and_last_and_refuses_unknown_ids(store: Store) -> None:
    standard_set(store)

    loaded = load_jobs(store, ["single", "ddp2x", "last"])

    assert [d.record.id for d in loaded] == ["single-a1", "ddp2x2-c3", "ddp2x2-c3"]
    with pytest.raises(UsageError, match="no job matches 'nope'"):
        load_jobs(store, ["nope"])


def test_write_report_creates_the_directory_and_returns_the_absolute_path(store: Store, tmp_path: Path) -> None:
    path = write_report(standard_set(store), tmp_path / "out" / "r.html")

    assert path == (tmp_path / "out" / "r.html").resolve()
    assert path.read_text().startswith("<!DOCTYPE html>")


def test_report_command_writes_the_page_and_refuses_unknown_jobs(store: Store, tmp_path: Path) -> None:
    standard_set(store)
    home = store.home

    ok = distrun("report", "single-a1", "ddp2-", "-o", str(tmp_path / "r.html"), home=home)
    bad = distrun("report", "nope", "-o", str(tmp_path / "bad.html"), home=home)

    assert ok.returncode == 0, ok.stderr
    assert f"report written to {tmp_path / 'r.html'}" in ok.stdout
    assert set(table((tmp_path / "r.html").read_text())) == {"single-a1", "ddp2-b2"}
    assert bad.returncode == 2 and "no job matches 'nope'" in bad.stderr and not (tmp_path / "bad.html").exists()


def test_dataparallel_counts_only_the_gpus_cuda_visible_devices_leaves_it(store: Store) -> None:
    record = make_job(store, "dp-v", [("node0", 1)], metric_rows("dp", 1, device="cuda"),
                      facts={"node0": {"gpus": 8}})
    plan = json.loads(store.job_dir("dp-v").plan.read_text())
    plan["hosts"][0]["env"]["CUDA_VISIBLE_DEVICES"] = "0,1"
    store.job_dir("dp-v").plan.write_text(json.dumps(plan))

    assert summarize(JobData.load(record, store.job_dir("dp-v"))).replicas == 2


# ---------------------------------------------------------------- launched as, scaling across hosts


def test_launched_as_is_the_recorded_command_with_its_hosts_and_script_arguments(store: Store) -> None:
    record = make_job(store, "t-1", [("node0", 2), ("node2", 2)], metric_rows("ddp", 4))
    store.update(record.id, command=["/srv/jobs/tiny.yaml", "-i", "/srv/lab.yaml", "--nodes", "node[0,2]", "--",
                                      "--steps", "20"])

    page = render([JobData.load(store.get("t-1"), store.job_dir("t-1"))])

    assert ("<p>Launched as:</p><pre>distrun launch /srv/jobs/tiny.yaml -i /srv/lab.yaml --nodes &#x27;node[0,2]&#x27; "
            "-- --steps 20</pre>") in page


def test_a_job_recorded_without_its_command_is_launched_again_on_its_own_hosts(store: Store) -> None:
    page = render([JobData.load(make_job(store, "t-2", [("node0", 2), ("node1", 2)], []), store.job_dir("t-2"))])

    assert ("distrun launch jobs/compare/t-2.yaml -i inventory/cluster.yaml --nodes &#x27;node[0-1]&#x27;</pre>"
            in page)


def test_a_failed_rows_note_says_exit_code_once(store: Store) -> None:
    failure = Failure("node1", FailureKind.EXIT, rank=3, exit_code=1, address="10.0.0.11").to_dict()
    record = make_job(store, "f-1", [("node0", 2), ("node1", 2)], [], state=JobState.FAILED, failures=[failure])

    notes = table(render([JobData.load(record, store.job_dir("f-1"))]))["f-1"]["Notes"]

    assert "FAILED: node1 (10.0.0.11) rank 3: exit code 1" in notes and "exit exit" not in notes


def scaling_runs(store: Store, rates: dict[int, float]) -> list[JobData]:
    """One job name run at several host counts, 2 processes per host, `rates` samples/s per process."""
    data = []
    for hosts, rate in rates.items():
        record = make_job(store, f"tiny-h{hosts}", [(f"node{i}", 2) for i in range(hosts)],
                          metric_rows("ddp", 2 * hosts, rate=rate))
        store.update(record.id, name="tiny")
        data.append(JobData.load(store.get(record.id), store.job_dir(record.id)))
    return data


def test_a_job_at_several_host_counts_gets_throughput_and_efficiency_against_hosts(store: Store) -> None:
    data = scaling_runs(store, {1: 100.0, 2: 95.0, 4: 80.0})
    summaries = [summarize(d) for d in data]

    series = scaling_series(summaries)
    base = series["tiny"][0]

    assert [run.hosts for run in series["tiny"]] == [1, 2, 4]
    throughput = {d.record.id: expected_numbers(d.metrics)["throughput"] for d in data}
    for run in series["tiny"]:
        expected = throughput[run.job_id] / (run.hosts * throughput[base.job_id])
        assert host_efficiency(run, base) == pytest.approx(expected)
    page = render(data)
    assert "<h2>Scaling across hosts</h2>" in page and "<table id=scaling>" in page
    assert f"<td class=num>{100 * host_efficiency(series['tiny'][2], base):.1f}%</td>" in page


def test_no_scaling_section_without_one_job_at_two_host_counts(store: Store) -> None:
    data = standard_set(store)

    assert scaling_series([summarize(d) for d in data]) == {}
    assert "Scaling across hosts</h2>" not in render(data)


def test_a_failed_run_is_left_out_of_the_scaling_series(store: Store) -> None:
    data = scaling_runs(store, {1: 100.0, 2: 95.0})
    failed = make_job(store, "tiny-h3", [(f"node{i}", 2) for i in range(3)], metric_rows("ddp", 6),
                      state=JobState.FAILED)
    failed.name = "tiny"
    data.append(JobData.load(failed, store.job_dir(failed.id)))

    assert [run.hosts for run in scaling_series([summarize(d) for d in data])["tiny"]] == [1, 2]
