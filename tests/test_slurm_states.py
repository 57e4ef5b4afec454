"""Slurm's job states and `scontrol show job` as distrun reads them."""

from __future__ import annotations

import pytest

from orchestrator.backends.slurm_commands import distrun_state, parse_job
from orchestrator.store import JobState

SCONTROL_LINE = (
    "JobId=7 JobName=tiny UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "ExitCode=0:0 RunTime=00:00:04 TimeLimit=UNLIMITED Partition=debug AllocNode:Sid=localhost:25091 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=node[0-1] BatchHost=node0 NumNodes=2 NumCPUs=2 "
    "Command=/home/a b/job.sbatch WorkDir=/work/main StdOut=/tmp/slurm-7.out Power= \n"
)


@pytest.mark.parametrize(("slurm", "distrun"), [
    ("PENDING", JobState.PENDING),
    ("CONFIGURING", JobState.PENDING),
    ("REQUEUED", JobState.PENDING),
    ("RUNNING", JobState.RUNNING),
    ("COMPLETING", JobState.RUNNING),
    ("SUSPENDED", JobState.RUNNING),
    ("COMPLETED", JobState.SUCCEEDED),
    ("FAILED", JobState.FAILED),
    ("TIMEOUT", JobState.FAILED),
    ("OUT_OF_MEMORY", JobState.FAILED),
    ("BOOT_FAIL", JobState.FAILED),
    ("DEADLINE", JobState.FAILED),
    ("CANCELLED", JobState.STOPPED),
    ("PREEMPTED", JobState.STOPPED),
    ("NODE_FAIL", JobState.LOST),
])
def test_each_slurm_state_maps_to_the_distrun_state_an_operator_expects(slurm: str, distrun: JobState) -> None:
    assert distrun_state(slurm) is distrun


def test_sacct_style_states_with_a_suffix_map_like_the_bare_state() -> None:
    assert distrun_state("CANCELLED by 0") is JobState.STOPPED
    assert distrun_state("COMPLETING+") is JobState.RUNNING


def test_a_state_slurm_may_add_later_counts_as_still_running() -> None:
    assert distrun_state("POWER_UP_NODE") is JobState.RUNNING


def test_scontrol_line_gives_state_reason_allocated_nodes_and_batch_host() -> None:
    job = parse_job(SCONTROL_LINE)

    assert (job.id, job.state, job.reason) == ("7", "RUNNING", "None")
    assert job.nodelist == "node[0-1]" and job.batch_host == "node0"
    assert job.allocated and job.distrun_state is JobState.RUNNING


def test_a_pending_job_has_no_allocation_yet() -> None:
    job = parse_job(SCONTROL_LINE.replace("JobState=RUNNING Reason=None", "JobState=PENDING Reason=Resources")
                    .replace("NodeList=node[0-1]", "NodeList=(null)"))

    assert job.reason == "Resources" and not job.allocated
