"""`checkpoint_dir` with `{job_id}`: a directory of each job's own, the same for all its attempts, so
a job launched again (docs/failures.md's example, twice in a row) starts afresh instead of resuming
the previous job's last checkpoint and training 0 steps."""

from __future__ import annotations

from pathlib import Path

from orchestrator.plan import build_plan
from orchestrator.spec import inventory_from_text
from tests.test_plan import INVENTORY, job


def planned(tmp_path: Path, job_id: str, attempt: int = 1):
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    spec = job("checkpoint_dir: /shared/ckpt/{job_id}\n", tmp_path)
    return build_plan(spec, list(inv.nodes[:2]), {}, job_id=job_id, inventory_path="inv.yaml", master=inv.nodes[0],
                      master_addr="10.0.0.10", master_port=29501, controller_cwd="/w", controller_env={},
                      attempt=attempt)


def test_job_id_in_checkpoint_dir_is_each_jobs_own_directory_shared_by_its_attempts(tmp_path: Path) -> None:
    first, again, second = planned(tmp_path, "survive-1"), planned(tmp_path, "survive-1", 2), planned(tmp_path, "s-2")

    assert first.checkpoint_dir == again.checkpoint_dir == "/shared/ckpt/survive-1"
    assert second.checkpoint_dir == "/shared/ckpt/s-2"
    assert {h.env["DISTRUN_CHECKPOINT_DIR"] for h in first.hosts} == {"/shared/ckpt/survive-1"}


def test_the_survive_example_keeps_its_checkpoints_per_job() -> None:
    text = (Path(__file__).resolve().parent.parent / "jobs" / "survive.yaml").read_text(encoding="utf-8")

    assert "checkpoint_dir: /tmp/distrun-ckpt/{job_id}" in text
