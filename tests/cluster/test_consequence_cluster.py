"""The verdict on the lab (3 namespace hosts x 2 ranks, real torchrun) for programs that do not help
it (issue 46): a third-party-style DDP program without `@record` whose rank 3 raises (the root cause's
`error:` line from its traceback; the other hosts failed as a consequence, each with its own error,
not "stopped by distrun"), and ranks that write a malformed torchrun error file (rank 1 on node0 named,
torchrun does not crash). bench/consequence_runs.py runs the first 10 times under an added load."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.helpers import distrun, unique_job_id

JOBS = Path(__file__).parent / "jobs"
PLAIN_DDP = JOBS / "plain_ddp.py"
BAD_ERROR_FILE = JOBS / "bad_error_file.py"
CONSEQUENCE = re.compile(r"(node[02]): failed as a consequence \(rank (\d): (\w[\w.]*(?:Error|Exception)\b[^)]*)\)")


def job_file(tmp_path: Path, script: Path, args: list[str]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: verdict\nscript: {script}\nargs: {json.dumps(args)}\nnproc_per_node: 2\n"
                    "env: {OMP_NUM_THREADS: '1'}\nstop_grace: 3\nheartbeat_timeout: 20\n")
    return path


def launch(cluster, tmp_path: Path, job_id: str, script: Path, args: list[str]) -> tuple[str, dict]:
    """Run the job on the lab to its end: its output and its record."""
    home = tmp_path / "home"
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    result = distrun("launch", str(job_file(tmp_path, script, args)), "-i", str(inv), "--no-live", "--job-id", job_id,
                     home=home, timeout=300)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    record = next(r for r in json.loads(distrun("ps", "--json", "--all", home=home).stdout) if r["id"] == job_id)
    return result.stdout, record


def consequences(summary: str) -> dict[str, tuple[int, str]]:
    """The `Other hosts` line's hosts that failed as a consequence: node -> (rank, error)."""
    other = next((line for line in summary.splitlines() if line.startswith("Other hosts: ")), "")
    return {node: (int(rank), error) for node, rank, error in CONSEQUENCE.findall(other)}


def test_a_planted_raise_without_record_is_the_root_cause_with_its_error_and_the_others_failed_as_a_consequence(
        cluster3, tmp_path):
    job_id = unique_job_id("plain-raise")
    out, record = launch(cluster3, tmp_path, job_id, PLAIN_DDP, ["--raise-rank", "3", "--raise-epoch", "2"])
    summary = out[out.index(f"job {job_id} FAILED"):]
    root = record["failures"][0]
    assert (root["host"], root["rank"], root["message"]) == ("node1", 3, "ValueError: planted on rank 3 at epoch 2")
    assert "  error: ValueError: planted on rank 3 at epoch 2" in summary, summary
    said = consequences(summary)
    assert sorted(said) == ["node0", "node2"], summary
    assert all(rank // 2 == int(node[-1]) for node, (rank, _) in said.items()), said
    others = {f["host"]: f for f in record["failures"][1:]}
    assert not any(f["stopped"] for f in others.values()), others


def test_malformed_error_files_leave_torchrun_standing_and_the_first_rank_named(cluster3, tmp_path):
    job_id = unique_job_id("bad-errfile")
    out, record = launch(cluster3, tmp_path, job_id, BAD_ERROR_FILE, [])
    root = record["failures"][0]
    assert (root["host"], root["rank"], root["kind"], root["exit_code"]) == ("node0", 1, "exit", 1), out[-3000:]
    logs = distrun("logs", job_id, home=tmp_path / "home").stdout
    set_aside = r"\[node0(?: err)?\] distrun: local rank 1's error file \S+ is not torch elastic's \(JSONDecodeError"
    assert re.search(set_aside, logs), logs[-3000:]
    assert "json.decoder.JSONDecodeError" not in logs and "ChildFailedError" in logs, logs[-3000:]  # torchrun stood
