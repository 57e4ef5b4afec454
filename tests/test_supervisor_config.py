"""The supervisor's configuration (remote/config.py): one record, the spec's defaults, one wire form."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.plan import LaunchPlan
from orchestrator.remote.config import SupervisorConfig
from orchestrator.spec.model import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_STOP_GRACE, JobSpec


def test_the_supervisors_defaults_are_the_job_specs() -> None:
    config = SupervisorConfig(job_id="j", node="n")
    job = JobSpec(name="j", path="job.yaml", script="train.py")
    assert config.heartbeat_timeout == DEFAULT_HEARTBEAT_TIMEOUT == job.heartbeat_timeout
    assert config.stop_grace == DEFAULT_STOP_GRACE == job.stop_grace
    assert LaunchPlan.__dataclass_fields__["heartbeat_timeout"].default == config.heartbeat_timeout


def test_the_wire_form_reads_back_as_the_same_configuration() -> None:
    config = SupervisorConfig(job_id="j", node="n", argv=["torchrun", "x.py"], env={"A": "1"}, heartbeat_timeout=None,
                              telemetry_interval=2.0, secret_names=["A"], first_rank=8, exact_ranks=False, attempt=3,
                              make_dirs=["/ckpt"])
    assert SupervisorConfig.from_line(config.to_line()) == config


@pytest.mark.parametrize("data, error", [({"job_id": "j", "node": "n", "heartbeat": 3}, "unknown configuration key"),
                                         ({"node": "n"}, "needs job_id and node")])
def test_a_configuration_with_a_key_the_supervisor_does_not_know_or_without_its_job_is_refused(
        data: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SupervisorConfig.from_dict(data)


def test_a_shipped_supervisor_given_a_wrong_configuration_exits_2_and_says_why() -> None:
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", "j", "n")
    bad = json.dumps({"job_id": "j", "node": "n", "heartbeat": 3}).encode() + b"\n"
    done = subprocess.run(argv, input=payload + bad, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"unknown configuration key(s): heartbeat" in done.stdout
