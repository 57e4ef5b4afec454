"""Telemetry end to end through `distrun launch` on this machine (local transport).

The "host" is given a fake `pynvml` (tests.test_sampler_nvml.FakeNvml) on its PYTHONPATH,
so its sampler reports two GPUs: one with its memory 99% full and one with an XID error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, distrun, job_lines, on_terminal

INTERVAL = 0.25
SHIM = f"""\
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.test_sampler_nvml import GB, FakeGpu, FakeNvml
sys.modules[__name__] = FakeNvml([FakeGpu(mem_used=79 * GB), FakeGpu(util=50)], xids=((1, 79),))
"""


def write_job(tmp: Path, seconds: float = 3.0) -> tuple[Path, Path]:
    (tmp / "fake").mkdir()
    (tmp / "fake" / "pynvml.py").write_text(SHIM)
    script = tmp / "work.py"
    script.write_text(f"import time\nprint('working', flush=True)\ntime.sleep({seconds})\nprint('done', flush=True)\n")
    job = tmp / "job.yaml"
    job.write_text(f"name: tel\nscript: {script}\nnproc_per_node: 1\ntelemetry: {{interval: {INTERVAL}}}\n")
    inventory = tmp / "inventory.yaml"
    node = f"{{name: localhost, host: localhost, transport: local, python: {sys.executable}}}"
    inventory.write_text(f"nodes:\n  - {node}\n")
    return job, inventory


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("telemetry")
    job, inventory = write_job(tmp)
    home = tmp / "home"
    started = time.monotonic()
    result = distrun("launch", str(job), "-i", str(inventory), home=home, env={"PYTHONPATH": str(tmp / "fake")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 120
    (job_dir,) = (home / "jobs").iterdir()
    return home, result, job_dir


def samples(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "telemetry.jsonl").read_text().splitlines()]


def test_host_and_gpu_samples_are_kept_in_the_job_directory(piped) -> None:
    _, _, job_dir = piped
    found = samples(job_dir)
    hosts = [s for s in found if s["kind"] == "host"]
    gpus = [s for s in found if s["kind"] == "gpu"]
    assert len(hosts) >= 8  # a 3 s job at 0.25 s, plus start-up
    assert all(s["node"] == "localhost" and s["interval"] == INTERVAL for s in hosts)
    assert {s["gpu"] for s in gpus} == {0, 1} and all(s["source"] == "nvml" for s in gpus)
    assert max(s["job_procs"] for s in hosts) >= 2  # torchrun and its worker
    times = [s["t"] for s in hosts]
    assert sorted(times) == times


def test_alerts_are_log_lines_in_the_record_and_in_the_summary(piped) -> None:
    home, result, job_dir = piped
    memory = "gpu0 memory 99% full (79.0 of 80.0 GB)"
    xid = "gpu1: 1 new XID error(s) (1 in all, last XID 79)"
    assert f"[localhost] distrun: ALERT {memory}" in result.stdout
    assert f"[localhost] distrun: ALERT {xid}" in result.stdout
    assert result.stdout.count("ALERT") == 2  # once per episode, not once per sample
    (record,) = json.loads(distrun("ps", "--json", home=home).stdout)
    assert [(a["node"], a["rule"], a["message"]) for a in record["alerts"]] == [
        ("localhost", "memory", memory), ("localhost", "xid", xid)]
    assert record["alerts"][1]["figures"] == {"gpu": 1, "new": 1, "all": 1}
    summary = (job_dir / "summary.txt").read_text()
    assert "alerts (2):" in summary and memory in summary
    assert f"ALERT {memory}" in job_lines(job_dir)


def test_no_live_view_when_stdout_is_piped(piped) -> None:
    _, result, _ = piped
    assert "\x1b[" not in result.stdout
    assert not re.search(r"gpu0\s+90%", result.stdout)


def test_top_prints_the_last_samples_of_the_finished_job(piped) -> None:
    home, _, _ = piped
    result = distrun("top", "last", home=home)
    assert result.returncode == 0, result.stderr
    assert re.search(r"localhost\s+cpu\s+\d+%", result.stdout)
    assert re.search(r"gpu0\s+90%\s+79\.0/80\.0 GB\s+61°C\s+412/700 W", result.stdout)
    assert "XID 1" in result.stdout and "2 alert(s)" in result.stdout


@pytest.mark.parametrize("live", [True, False], ids=["live", "no-live"])
def test_live_view_on_a_terminal_unless_no_live(tmp_path: Path, live: bool) -> None:
    job, inventory = write_job(tmp_path, seconds=2.0)
    args = ["launch", str(job), "-i", str(inventory)] + ([] if live else ["--no-live"])
    out = on_terminal(args, tmp_path / "home", {"PYTHONPATH": str(tmp_path / "fake")})
    table = re.compile(r"gpu0\s+(\x1b\[[0-9;]*m)*90%")
    assert "working" in out and "succeeded" in out
    assert bool(table.search(out)) is live
    assert ("\x1b[2K" in out) is live  # the live area redraws itself in place
