"""Controller-side telemetry: alert rules on a clock the tests control, the table, the live view, `top`."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator import telemetry
from orchestrator.remote import sampler
from orchestrator.remote.gpu import SHIPPED_NVML
from orchestrator.store import JobDir, JobRecord, JobState
from orchestrator.telemetry import alerts, top, view
from orchestrator.telemetry.alerts import Aggregator, AlertRules


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gpu(index: int = 0, **fields: Any) -> dict[str, Any]:
    sample = {"kind": "gpu", "gpu": index, "util": 90, "mem_used_mb": 40000.0, "mem_total_mb": 81920.0,
              "temp_c": 60, "power_w": 400.0, "power_limit_w": 700.0, "throttle": [], "ecc_uncorrected": 0,
              "xid": 0, "job_mem_mb": None}
    return {**sample, **fields}


def host(**fields: Any) -> dict[str, Any]:
    return {"kind": "host", "cpu_pct": 35.0, "load1": 1.5, "mem_used_mb": 10240.0, "mem_total_mb": 65536.0,
            "net_rx_bps": 2048.0, "net_tx_bps": 1024.0, "job_procs": 3, "job_cpu_pct": 180.0, "job_rss_mb": 3072.0,
            **fields}


@pytest.fixture
def clock() -> Clock:
    return Clock()


def aggregator(clock: Clock, nodes: tuple[str, ...] = ("node0",), interval: float | None = 1.0,
               **rules: Any) -> Aggregator:
    return Aggregator(nodes, interval, AlertRules(**rules), clock=clock)


def feed(agg: Aggregator, clock: Clock, samples: list[dict[str, Any]], every: float = 1.0,
         node: str = "node0") -> list[str]:
    """Feed samples one `every` seconds apart; the messages of the alerts they raised."""
    fired = []
    for sample in samples:
        fired += [a.message for a in agg.observe(node, sample)]
        clock.now += every
    return fired


# ---------------------------------------------------------------- alert rules


def test_idle_gpu_alerts_once_after_the_idle_time(clock: Clock) -> None:
    agg = aggregator(clock, idle_after_s=10)
    assert feed(agg, clock, [gpu(util=2)] * 10) == []
    assert feed(agg, clock, [gpu(util=2)] * 20) == ["gpu0 idle for 10 s (utilisation 2% < 5%)"]


def test_idle_gpu_alerts_again_after_it_was_busy_in_between(clock: Clock) -> None:
    agg = aggregator(clock, idle_after_s=3)
    fired = feed(agg, clock, [gpu(util=0)] * 5 + [gpu(util=80)] + [gpu(util=0)] * 5)
    assert len(fired) == 2


def test_gpu_the_job_does_not_use_is_not_reported_idle(clock: Clock) -> None:
    agg = aggregator(clock, idle_after_s=2)
    fired = []
    for _ in range(5):
        fired += feed(agg, clock, [gpu(0, util=0, job_mem_mb=1000.0), gpu(1, util=0, job_mem_mb=0.0)], every=0.5)
    assert fired == ["gpu0 idle for 2 s (utilisation 0% < 5%)"]


def test_memory_above_the_limit_alerts_once_per_episode(clock: Clock) -> None:
    agg = aggregator(clock)
    full = gpu(mem_used_mb=79000.0, mem_total_mb=81920.0)
    fired = feed(agg, clock, [full, full, gpu(), full])
    assert fired == ["gpu0 memory 96% full (77.1 of 80.0 GB)"] * 2


def test_thermal_throttling_alerts_when_it_lasts(clock: Clock) -> None:
    agg = aggregator(clock, throttle_after_s=3)
    hot = gpu(throttle=["hw_thermal", "sw_thermal"], temp_c=91, power_w=690.0)
    fired = feed(agg, clock, [hot] * 6)
    assert fired == ["gpu0 clocks throttled (hw_thermal, sw_thermal) for 3 s: 91°C, 690/700 W"]


def test_idle_clocks_are_not_throttling(clock: Clock) -> None:
    agg = aggregator(clock, throttle_after_s=0)
    assert feed(agg, clock, [gpu(throttle=["gpu_idle"])] * 5) == []


def test_power_capping_alerts(clock: Clock) -> None:
    agg = aggregator(clock, throttle_after_s=0)
    assert feed(agg, clock, [gpu(throttle=["sw_power_cap"])]) == [
        "gpu0 clocks throttled (sw_power_cap) for 0 s: 60°C, 400/700 W"]


def test_new_ecc_errors_alert_and_old_ones_do_not(clock: Clock) -> None:
    agg = aggregator(clock)
    fired = feed(agg, clock, [gpu(ecc_uncorrected=2), gpu(ecc_uncorrected=2), gpu(ecc_uncorrected=5)])
    assert fired == ["gpu0: 3 new uncorrectable ECC error(s) (5 in all)"]


def test_every_xid_since_the_sampler_started_alerts(clock: Clock) -> None:
    agg = aggregator(clock)
    fired = feed(agg, clock, [gpu(xid=1, xid_last=79), gpu(xid=1, xid_last=79), gpu(xid=2, xid_last=48)])
    assert fired == ["gpu0: 1 new XID error(s) (1 in all, last XID 79)",
                     "gpu0: 1 new XID error(s) (2 in all, last XID 48)"]


def test_host_whose_samples_stop_alerts_once_until_they_resume(clock: Clock) -> None:
    agg = aggregator(clock, ("node0", "node1"), interval=1.0)
    agg.observe("node0", host())
    agg.observe("node1", host())
    clock.now += 4
    agg.observe("node1", host())
    assert agg.check() == []
    clock.now += 2
    (alert,) = agg.check()
    assert (alert.node, alert.rule) == ("node0", "silent")
    assert alert.message == "no telemetry samples for 6 s since the last (expected every 1 s)"
    clock.now += 10
    assert [a.node for a in agg.check()] == ["node1"]
    agg.observe("node0", host())
    agg.check()
    clock.now += 6
    assert [a.node for a in agg.check(["node0"])] == ["node0"]


def test_host_whose_output_waits_unread_in_the_controller_is_not_silent_and_counts_from_then(
        clock: Clock) -> None:
    agg = aggregator(clock, ("node0",), interval=1.0)
    agg.observe("node0", host())
    for _ in range(30):  # 30 s behind: the controller has not read what node0 sent
        clock.now += 1
        assert agg.check(waiting=["node0"]) == []
    clock.now += 5  # caught up, and nothing new since: 5 s of its own silence, not 35
    assert agg.check() == []
    clock.now += 1
    (alert,) = agg.check()
    assert alert.message == "no telemetry samples for 6 s since the last (expected every 1 s)"


def test_silence_threshold_is_three_intervals_and_at_least_five_seconds() -> None:
    rules = AlertRules()
    assert rules.silent_after(0.25) == 5.0
    assert rules.silent_after(10) == 30.0


def test_host_that_never_sent_a_sample_gets_a_startup_grace(clock: Clock) -> None:
    agg = aggregator(clock, interval=1.0)
    clock.now += alerts.STARTUP_GRACE + 4
    assert agg.check() == []
    clock.now += 2
    assert [a.message for a in agg.check()] == [
        "no telemetry samples for 6 s and none yet (expected every 1 s)"]


def test_no_silence_alerts_when_telemetry_is_off(clock: Clock) -> None:
    agg = aggregator(clock, interval=None)
    clock.now += 1000
    assert agg.check() == []


def test_alert_record_carries_time_node_and_message() -> None:
    alert = alerts.Alert("node1", "idle", "gpu0 idle for 60 s", t=time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1)))
    assert alert.text() == "03:04:05 node1: gpu0 idle for 60 s"
    assert alert.record() == {"t": alert.t, "node": "node1", "rule": "idle", "rank": None,
                              "message": "gpu0 idle for 60 s", "figures": {}, "evidence": ""}
    assert alert.line() == "ALERT gpu0 idle for 60 s"


def test_summary_lists_at_most_ten_alerts() -> None:
    lines = alerts.summary_lines([f"a{i}" for i in range(12)])
    assert lines[0] == "  alerts (12):" and lines[1] == "    a0" and len(lines) == 12
    assert "2 more" in lines[-1]
    assert alerts.summary_lines([]) == []


# ---------------------------------------------------------------- the table


def rendered(table: Any, width: int = 160, terminal: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=terminal, color_system="truecolor" if terminal else None).print(table)
    return out.getvalue()


def filled(clock: Clock) -> Aggregator:
    agg = aggregator(clock, ("node0", "node1", "node2"))
    agg.observe("node0", host())
    agg.observe("node0", gpu(0, util=97, temp_c=71, power_w=650.0, throttle=["sw_power_cap"], job_mem_mb=30720.0))
    agg.observe("node0", gpu(1, util=2, mem_used_mb=80000.0))
    agg.observe("node1", host(cpu_pct=88.0))
    agg.observe_metrics({"step": 120, "samples_per_s": 1234.56, "rank": 0})
    return agg


def test_table_shows_hosts_gpus_and_throughput(clock: Clock) -> None:
    agg = filled(clock)
    clock.now += 2
    text = rendered(view.render(agg, "job-1", clock(), ["12:00:00 node0: gpu1 memory 98% full"]))
    node0_gpu0 = next(line for line in text.splitlines() if "gpu0" in line)
    assert re.search(r"gpu0\s+97%\s+39\.1/80\.0 GB\s+71°C\s+650/700 W", node0_gpu0)
    assert "throttle: sw_power_cap" in node0_gpu0 and "job 30.0 GB" in node0_gpu0
    assert re.search(r"node1\s+cpu\s+88%\s+10\.0/64\.0 GB", text)
    assert "job: 3 procs, cpu 180%, rss 3.0 GB" in text and "2.0 s ago" in text
    assert re.search(r"node2\s+cpu\s+-", text) and "no sample yet" in text
    assert "throughput 1234.6 samples/s at step 120" in text
    assert "1 alert(s), latest: 12:00:00 node0: gpu1 memory 98% full" in text


def test_table_of_a_finished_job_shows_when_the_last_sample_came(clock: Clock) -> None:
    agg = aggregator(clock, interval=1.0)
    agg.observe("node0", host(), at=time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1)))
    assert "last 03:04:05" in rendered(view.render(agg, "job-1", None, []))


def test_too_many_gpus_for_the_screen_fold_into_one_row_per_host(clock: Clock) -> None:
    agg = aggregator(clock, ("node0",))
    agg.observe("node0", host())
    for index in range(8):
        agg.observe("node0", gpu(index, util=50 + index, temp_c=60 + index, power_w=100.0))
    text = rendered(view.render(agg, "job-1", clock(), [], max_rows=4))
    assert "gpu3" not in text
    assert re.search(r"8 gpus\s+54% \(min 50%\)\s+max 49%\s+max 67°C\s+800 W", text)


def test_hosts_past_the_screen_are_counted_in_one_row_not_drawn(clock: Clock) -> None:
    agg = aggregator(clock, tuple(f"node{i}" for i in range(10)))
    table = view.render(agg, "job-1", clock(), [], max_rows=4)
    text = rendered(table)
    assert table.row_count == 4
    assert re.search(r"node2\s+cpu", text) and "node3 " not in text
    assert "… 7 more hosts" in text


def test_table_renders_on_a_terminal_console_with_colours(clock: Clock) -> None:
    text = rendered(view.render(filled(clock), "job-1", clock(), []), terminal=True)
    assert "\x1b[" in text and "gpu1" in text


# ---------------------------------------------------------------- the live view


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def monitor(alerts: list[alerts.Alert], interval: float | None = 1.0) -> view.Monitor:
    return view.Monitor(["node0"], interval, alerts.extend, lambda _node: True, title="job-1")


def test_live_view_keeps_log_lines_above_the_table() -> None:
    screen = TTY()
    mon = monitor([])
    writer = mon.terminal(screen, live=True)
    assert isinstance(writer, view.ConsoleWriter)
    mon.start()
    mon.sample("node0", host())
    mon.sample("node0", gpu(0, util=77))
    writer.write("\x1b[36m[node0 r0]\x1b[0m step 1\n[node0 r0] step 2\n[node0 r0] partial")
    writer.flush()
    mon.live.refresh()
    mon.stop()
    out = screen.getvalue()
    assert "step 1" in out and "step 2" in out and "partial" not in out
    assert out.rindex("step 2") < out.rindex("gpu0")  # the frame was drawn under the log lines
    assert "\x1b[36m[node0 r0]" in out
    assert re.search(r"gpu0\s+77%", out)


def on_terminal(output: str) -> list[str]:
    """The lines a terminal shows once it has run `output`: text, newlines, carriage returns and the
    cursor-up and erase-line sequences rich's live display draws with (colours and the rest ignored)."""
    screen, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", output):
        if token == "\n":
            row, col = row + 1, 0
            screen += [""] * (row + 1 - len(screen))
        elif token == "\r":
            col = 0
        elif token.endswith("A") and token.startswith("\x1b["):
            row = max(row - int(token[2:-1] or 1), 0)
        elif token == "\x1b[2K":
            screen[row] = ""
        elif not token.startswith("\x1b"):
            screen[row] = screen[row][:col].ljust(col) + token + screen[row][col + len(token):]
            col += len(token)
    return [line.rstrip() for line in screen if line.strip()]


def test_the_live_table_is_cleared_when_the_job_ends_and_the_log_lines_stay() -> None:
    screen = TTY()
    mon = monitor([])
    writer = mon.terminal(screen, live=True)
    mon.start()
    writer.write("[node0 r0] step 1\n")
    writer.flush()
    mon.live.refresh()
    assert any("no metrics yet" in line for line in on_terminal(screen.getvalue())), "the table was drawn"
    mon.stop()
    screen.write("job job-1 FAILED\n")
    assert on_terminal(screen.getvalue()) == ["[node0 r0] step 1", "job job-1 FAILED"]


def test_a_process_that_exits_just_after_its_writer_printed_still_exits() -> None:
    """The interpreter's exit flushes the writer; a flush then must not start a timer thread (it
    would never start, and the process would hang: the fault-tolerant job's parent did)."""
    program = ("import sys\nfrom rich.console import Console\nfrom orchestrator.telemetry.view import ConsoleWriter\n"
               "writer = ConsoleWriter(Console(file=sys.stdout, force_terminal=True))\n"
               "writer.write('last line\\n')\nwriter.flush()\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, "last line\n"), done.stderr


def test_log_lines_flushed_in_quick_succession_go_out_in_one_print_at_its_turn() -> None:
    screen = TTY()
    writer = view.ConsoleWriter(Console(file=screen, force_terminal=True), every=0.3)
    writer.write("step 1\n")
    writer.flush()
    writer.write("step 2\n")
    writer.flush()
    writer.write("step 3\n")
    writer.flush()
    assert "step 1" in screen.getvalue() and "step 2" not in screen.getvalue()  # each print redraws the table
    time.sleep(0.6)
    assert screen.getvalue().count("step 2") == 1 and "step 3" in screen.getvalue()


def test_no_live_view_when_not_asked_or_not_a_terminal() -> None:
    piped = io.StringIO()
    assert monitor([]).terminal(piped, live=True) is piped
    screen = TTY()
    assert monitor([]).terminal(screen, live=False) is screen
    assert monitor([]).terminal(None, live=True) is None


def test_monitor_hands_alerts_to_its_callback_and_stops_after_stop() -> None:
    alerts: list[alerts.Alert] = []
    mon = monitor(alerts)
    mon.sample("node0", gpu(mem_used_mb=81000.0))
    mon.stop()
    mon.sample("node0", gpu(1, mem_used_mb=81000.0))
    assert [a.rule for a in alerts] == ["memory"]


def test_monitor_names_a_straggler_from_every_ranks_metrics_and_keeps_rank0s_as_the_jobs() -> None:
    alerts: list[alerts.Alert] = []
    mon = view.Monitor(["node0", "node1"], None, alerts.extend, lambda _node: True, title="job-1", world_size=4)
    for step in range(1, 7):
        for rank in range(4):
            record = {"step": step, "rank": rank, "busy_s": 0.5 if rank == 3 else 0.1, "step_time_s": 0.5}
            mon.metrics(f"node{rank // 2}", record | ({"samples_per_s": 8.0} if rank == 0 else {}))
    assert [(a.node, a.rule) for a in alerts] == [("node1", "straggler")]
    assert alerts[0].message.startswith("straggler: rank 3 takes 0.500 s a step, 5.0x the median 0.100 s")
    assert mon.aggregator.alerts == alerts  # the live view's caption counts it
    assert mon.aggregator.snapshot()[1] == {"step": 6, "rank": 0, "busy_s": 0.1, "step_time_s": 0.5,
                                            "samples_per_s": 8.0}


def test_monitor_reports_a_silent_host_from_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view, "TICK", 0.05)
    alerts: list[alerts.Alert] = []
    mon = view.Monitor(["node0", "node1"], 0.1, alerts.extend, lambda node: node == "node0", title="job-1",
                            rules=AlertRules(silent_min_s=0.3, silent_intervals=1))
    mon.sample("node0", host())
    mon.sample("node1", host())
    mon.start()
    time.sleep(0.8)
    mon.stop()
    assert [(a.node, a.rule) for a in alerts] == [("node0", "silent")]


def test_hosts_gone_silent_in_one_check_are_handed_on_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """One call, so that the launcher records them in one database write, not one per host."""
    monkeypatch.setattr(view, "TICK", 0.05)
    calls: list[list[alerts.Alert]] = []
    nodes = [f"node{i}" for i in range(50)]
    mon = view.Monitor(nodes, 0.1, calls.append, lambda _node: True, title="job-1",
                       rules=AlertRules(silent_min_s=0.3, silent_intervals=1))
    for node in nodes:
        mon.sample(node, host())
    mon.start()
    time.sleep(0.8)
    mon.stop()
    assert [len(call) for call in calls] == [50]


# ---------------------------------------------------------------- history and `top`


def write_job(root: Path, state: JobState = JobState.SUCCEEDED) -> tuple[JobDir, JobRecord]:
    job_dir = JobDir(root)
    job_dir.create()
    job_dir.plan.write_text(json.dumps({"telemetry_interval": 0.5}))
    now = time.time()
    lines = [{**host(cpu_pct=10.0 + i), "node": "node0", "t": now - 3 + i} for i in range(3)]
    lines += [{**gpu(0, util=42), "node": "node0", "t": now}]
    job_dir.telemetry.write_text("".join(json.dumps(line) + "\n" for line in lines))
    job_dir.metrics.write_text(json.dumps({"step": 8, "samples_per_s": 55.5}) + "\n")
    record = JobRecord(id="job-1", name="job", spec_path="", inventory="", hosts=["node0"], state=state,
                       alerts=["12:00:00 node0: gpu0 idle for 60 s (utilisation 0% < 5%)"])
    return job_dir, record


def test_follower_returns_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n{"a": 2')
    follower = top.JsonlFollower(path)
    assert follower.read() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write('}\nnot json\n{"a": 3}\n')
    assert follower.read() == [{"a": 2}, {"a": 3}]
    assert follower.read() == []


def test_follower_starts_near_the_end_of_a_big_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(1000)))
    assert top.JsonlFollower(path, tail_bytes=50).read() == [{"i": i} for i in range(996, 1000)]


def test_top_of_a_finished_job_prints_its_last_samples(tmp_path: Path) -> None:
    job_dir, record = write_job(tmp_path)
    out = io.StringIO()
    top.top(job_dir, lambda: record, Console(file=out, width=160))
    text = out.getvalue()
    assert "job-1 · succeeded" in text
    assert re.search(r"node0\s+cpu\s+12%", text) and re.search(r"gpu0\s+42%", text)
    assert "throughput 55.5 samples/s at step 8" in text and "gpu0 idle for 60 s" in text


def test_top_follows_a_running_job_until_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(top, "TICK", 0.05)
    job_dir, record = write_job(tmp_path, JobState.RUNNING)
    states = iter([JobState.RUNNING] * 3 + [JobState.SUCCEEDED] * 10)

    def current() -> JobRecord:
        record.state = next(states)
        if record.state is JobState.SUCCEEDED:
            with open(job_dir.telemetry, "a") as fh:
                fh.write(json.dumps({**gpu(0, util=99), "node": "node0", "t": time.time()}) + "\n")
        return record

    out = TTY()
    top.top(job_dir, current, Console(file=out, width=160, height=40, force_terminal=True))
    text = out.getvalue()
    assert "job-1 · running" in text and "s ago" in text
    assert re.search(r"gpu0\s+\S*99%", text)


@pytest.mark.parametrize("width", [80, 120])
def test_top_fits_the_terminals_width_one_line_a_row(tmp_path: Path, width: int) -> None:
    job_dir, record = write_job(tmp_path, JobState.RUNNING)
    out = io.StringIO()
    top.top(job_dir, lambda: record, Console(file=out, width=width, height=40, force_terminal=True), once=True)
    shown = [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in out.getvalue().splitlines()]
    shown = [line for line in shown if line]
    assert max(len(line) for line in shown) <= width
    assert len(shown) == 6, shown  # title, header, rule, node0's row, gpu0's row, the caption
    assert re.search(r"node0\s+cpu\s+12%\s+10\.0/64\.0 GB\s+0\.0 s ago · job: 3 pr", shown[3])
    assert re.search(r"^\s+gpu0\s+42%", shown[4]) and shown[5].startswith("throughput 55.5 samples/s at step 8")


def test_top_into_a_pipe_keeps_every_note_whole(tmp_path: Path) -> None:
    job_dir, record = write_job(tmp_path, JobState.RUNNING)
    out = io.StringIO()
    top.top(job_dir, lambda: record, Console(file=out, width=80), once=True)
    words = " ".join(out.getvalue().split())  # folded over lines where need be, but whole
    assert "load 1.50 · net ↓2 KB/s ↑1 KB/s" in words and "gpu0 idle for 60 s (utilisation 0% < 5%)" in words


def test_top_once_prints_one_frame_of_a_running_job(tmp_path: Path) -> None:
    job_dir, record = write_job(tmp_path, JobState.RUNNING)
    out = io.StringIO()
    top.top(job_dir, lambda: record, Console(file=out, width=160, force_terminal=True), once=True)
    assert out.getvalue().count("job-1 · running") == 1


# ---------------------------------------------------------------- shipping NVML


def test_nvml_bindings_are_shipped_only_to_hosts_with_gpus() -> None:
    shipped = telemetry.shipped_modules(8)
    assert list(shipped) == [SHIPPED_NVML] and "def nvmlInit" in shipped[SHIPPED_NVML]
    assert telemetry.shipped_modules(0) == {}


def test_shipped_bindings_are_used_where_the_host_has_no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    ((name, source),) = telemetry.shipped_modules(1).items()
    module = types.ModuleType(name)  # installed as the bootstrap installs a shipped module
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, f"<distrun:{name}>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails on this host
    assert sampler.import_nvml() is module
    assert callable(module.nvmlInit)


def test_a_hosts_strings_reach_tops_table_escaped(clock: Clock) -> None:
    """A compromised host's sample carrying an OSC title in a throttle reason: top's frame shows it
    as text (rich would write the escape as it is)."""
    agg = aggregator(clock)
    agg.observe("node0", gpu(throttle=["hw_slowdown\x1b]0;pwned\x07\x1b[2J"]))
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    console.print(view.render(agg, "job", clock(), []))
    shown = console.file.getvalue()
    assert "hw_slowdown\\x1b]0;pwned\\x07\\x1b[2J" in shown
    assert "\x07" not in shown and "\x1b]" not in shown and "\x1b[2J" not in shown
