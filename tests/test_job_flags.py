"""A job from the command line: a script launch, flags over a job file, and the job written back as YAML."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.run.request import LaunchRequest
from orchestrator.spec import HostSelection, job_from_text, load_job
from orchestrator.spec.overrides import apply_overrides, is_script, job_for_launch, job_from_script, job_to_yaml

REPO = Path(__file__).resolve().parent.parent


def test_a_script_launch_is_named_after_the_file_with_every_other_key_default(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train my.model.py").write_text("print('x')\n")

    job = job_from_script("train my.model.py")

    assert (job.name, job.script, job.nproc_per_node, job.nnodes, job.args) == (
        "train-my.model", "train my.model.py", None, None, ())
    assert is_script("train.py") and not is_script("job.yaml")


def test_a_missing_script_is_one_line_naming_it(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^nope\.py: file not found \(the path is relative to the current "):
        job_from_script("nope.py")


def test_flags_go_over_the_jobs_own_values() -> None:
    job = load_job(REPO / "jobs" / "tiny.yaml")

    changed = apply_overrides(job, name="tiny2", nproc_per_node="4",
                              env=["OMP_NUM_THREADS=2", "TOKEN=${env:MY_TOKEN}", "EMPTY="])

    assert (changed.name, changed.nproc_per_node) == ("tiny2", 4)
    assert changed.env == {"OMP_NUM_THREADS": "2", "EMPTY": ""} and changed.secrets == {"TOKEN": "MY_TOKEN"}
    assert apply_overrides(job, nproc_per_node="auto").nproc_per_node is None
    assert apply_overrides(job) == job


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "bad name"}, "--name 'bad name': not a job name"),
    ({"nproc_per_node": "0"}, "--nproc-per-node '0': give a number from 1, or auto"),
    ({"nproc_per_node": "many"}, "--nproc-per-node 'many'"),
    ({"env": ["NOEQUALS"]}, "--env 'NOEQUALS': expected KEY=VALUE"),
    ({"env": ["1BAD=x"]}, "--env '1BAD=x': '1BAD' is not a variable name"),
    ({"env": ["A=pre-${env:X}"]}, "must be the whole value"),
    ({"env": ["TOKEN=${DISTRUN_TEST_UNSET}"]}, "--env 'TOKEN=${DISTRUN_TEST_UNSET}': $DISTRUN_TEST_UNSET is not set "
                                               "in this shell, and distrun passes values as written"),
    ({"env": ["P=a-$DISTRUN_TEST_UNSET"]}, "write P='${env:DISTRUN_TEST_UNSET}' to pass it as a secret"),
])
def test_a_bad_flag_value_names_the_flag(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        apply_overrides(load_job(REPO / "jobs" / "tiny.yaml"), **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["tiny.yaml", "resnet50.yaml", "compare/ddp.yaml"])
def test_a_job_written_as_yaml_reads_back_as_the_same_job(name: str) -> None:
    job = load_job(REPO / "jobs" / name)

    again = job_from_text(job_to_yaml(job), "again.yaml")

    assert replace(again, path=job.path) == job


def test_yaml_of_a_job_with_every_section_reads_back_the_same(tmp_path) -> None:
    text = ("name: full\nmodule: pkg.train\nargs: [--lr, '0.1']\nnnodes: 2\nnproc_per_node: 3\nworkdir: /srv/w\n"
            "env: {A: '1', KEY: '${env:SECRET}'}\nrendezvous: {backend: c10d, port: 29612}\nmax_restarts: 1\n"
            "select: {names: ['node[0-1]'], labels: [gpu]}\ntelemetry: {interval: 5, enabled: false}\n"
            "sync: true\nbackend: slurm\nslurm: {partition: gpu, extra: [--exclusive]}\nheartbeat_timeout: 30\n"
            "stop_grace: 2\n")
    job = job_from_text(text, "full.yaml")

    again = job_from_text(job_to_yaml(job), "again.yaml")

    assert replace(again, path=job.path) == job
    assert "${env:SECRET}" in job_to_yaml(job) and again.secrets == {"KEY": "SECRET"}
    assert again.backend_sections["slurm"].entries["partition"].value == "gpu"


def test_the_recorded_command_names_the_hosts_as_a_range_and_every_flag_that_changed_the_job() -> None:
    request = LaunchRequest("jobs/tiny.yaml", inventory="lab.yaml", selection=HostSelection(labels=("gpu",)),
                            nnodes=2, backend="ssh", options=["k=v"], env=["A=1"], name="t2", nproc_per_node="1",
                            extra_args=["--steps", "20"])

    args = request.reproduce(["node0", "node2"], "/srv/lab.yaml")

    assert args == [str(REPO / "jobs" / "tiny.yaml"), "-i", "/srv/lab.yaml", "--nodes", "node[0,2]", "--nnodes", "2",
                    "--backend", "ssh", "-o", "k=v", "--env", "A=1", "--name", "t2", "--nproc-per-node", "1",
                    "--", "--steps", "20"]
    assert request.reproduce([], "<built-in>")[1:] == ["--nnodes", "2", "--backend", "ssh", "-o", "k=v", "--env",
                                                       "A=1", "--name", "t2", "--nproc-per-node", "1", "--",
                                                       "--steps", "20"]


def test_the_command_of_a_restarted_job_names_its_current_hosts_and_spares_and_keeps_nnodes() -> None:
    ranged = LaunchRequest("jobs/tiny.yaml", nnodes_range=(1, 2))
    counted = LaunchRequest("jobs/tiny.yaml")

    assert ranged.reproduce(["node0", "node2"], "/srv/lab.yaml", ["node3"])[3:] == [
        "--nodes", "node[0,2-3]", "--nnodes", "1:2"]
    assert counted.reproduce(["node0", "node2"], "/srv/lab.yaml", ["node3"])[3:] == [
        "--nodes", "node[0,2-3]", "--nnodes", "2"]
    assert counted.reproduce(["node0"], "/srv/lab.yaml")[3:] == ["--nodes", "node0"]


def test_an_nnodes_range_on_the_command_line_goes_over_the_jobs_nnodes() -> None:
    job = job_for_launch(str(REPO / "jobs" / "tiny.yaml"), nnodes_range=(1, 3))

    assert (job.min_nnodes, job.nnodes) == (1, 3)


def test_a_secret_reference_is_not_taken_for_an_unexpanded_shell_variable() -> None:
    job = apply_overrides(load_job(REPO / "jobs" / "tiny.yaml"), env=["B=${env:DISTRUN_TEST_UNSET}"])

    assert job.secrets == {"B": "DISTRUN_TEST_UNSET"}


def test_yaml_of_a_job_with_restarts_spares_and_an_nnodes_range_reads_back_the_same() -> None:
    job = job_from_text("name: r\nmodule: pkg.train\nnnodes: '1:2'\nhang_timeout: 30\nspares: 1\n"
                        "restarts: {max: 2, backoff: 5, on: [host-lost, hang]}\ncheckpoint_dir: /ckpt\n", "r.yaml")

    again = job_from_text(job_to_yaml(job), "again.yaml")

    assert replace(again, path=job.path) == job
    assert (again.min_nnodes, again.nnodes, again.restarts.on) == (1, 2, ("host-lost", "hang"))
