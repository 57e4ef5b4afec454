"""Job files: every key read into JobSpec, secrets kept apart, and one clear line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import registry
from orchestrator.errors import SpecError, UsageError
from orchestrator.spec import Rendezvous, Select, Telemetry, job_from_text, load_job

REPO = Path(__file__).resolve().parents[1]
SHIPPED_JOBS = sorted((REPO / "jobs").glob("*.yaml"))

RESNET = """\
name: resnet50
script: jobs/train_resnet50.py   # or  module: package.module
args: [--steps, "50"]
nnodes: 2
nproc_per_node: auto
workdir: /shared/project
env: {NCCL_DEBUG: WARN, WANDB_API_KEY: "${env:WANDB_API_KEY}"}
rendezvous: {backend: static, port: auto}
max_restarts: 0
select: {names: [], labels: []}
telemetry: {interval: 2}
"""


@pytest.fixture(autouse=True)
def in_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory holding the script the example job names."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train_resnet50.py").write_text("print('train')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        job_from_text(text, "jobs/x.yaml")
    return str(caught.value)


def test_example_job_loads_with_auto_values_as_none() -> None:
    job = job_from_text(RESNET, "jobs/resnet50.yaml")
    assert job.path == "jobs/resnet50.yaml"
    assert (job.name, job.script, job.module) == ("resnet50", "jobs/train_resnet50.py", None)
    assert job.args == ("--steps", "50")
    assert (job.nnodes, job.nproc_per_node, job.workdir) == (2, None, "/shared/project")
    assert job.rendezvous == Rendezvous(backend="static", port=None)
    assert (job.max_restarts, job.select, job.telemetry) == (0, Select(), Telemetry(interval=2.0))


def test_whole_value_env_reference_becomes_a_secret_not_an_env_value() -> None:
    job = job_from_text(RESNET, "jobs/resnet50.yaml")
    assert job.env == {"NCCL_DEBUG": "WARN"}
    assert job.secrets == {"WANDB_API_KEY": "WANDB_API_KEY"}


def test_secret_may_read_a_differently_named_controller_variable() -> None:
    job = job_from_text(RESNET.replace("${env:WANDB_API_KEY}", "${env:MY_WANDB}"), "j.yaml")
    assert job.secrets == {"WANDB_API_KEY": "MY_WANDB"}


def test_every_key_is_read() -> None:
    text = """\
name: big
module: pkg.train
args: [--lr, 0.1, --fast, true]
nnodes: 4
nproc_per_node: 8
workdir: ~/project
env: {OMP_NUM_THREADS: 4}
rendezvous: {backend: c10d, port: 29500}
max_restarts: 3
select: {names: [node0, node1], labels: [h100]}
telemetry: {interval: 0.5, enabled: false}
sync: true
backend: slurm
slurm: {partition: gpu, time: 1:30:00, account: ml, gpus_per_node: 8, extra: [--exclusive]}
heartbeat_timeout: 30
stop_grace: 0
hang_timeout: 600
"""
    job = job_from_text(text, "j.yaml")
    assert (job.module, job.script, job.args) == ("pkg.train", None, ("--lr", "0.1", "--fast", "true"))
    assert (job.nnodes, job.nproc_per_node, job.workdir, job.env) == (4, 8, "~/project", {"OMP_NUM_THREADS": "4"})
    assert job.rendezvous == Rendezvous(backend="c10d", port=29500)
    assert job.max_restarts == 3
    assert job.select == Select(names=("node0", "node1"), labels=("h100",))
    assert job.telemetry == Telemetry(interval=0.5, enabled=False)
    assert (job.sync, job.backend) == (True, "slurm")
    assert list(job.backend_sections) == ["slurm"]  # its keys are the Slurm backend's to check
    assert (job.heartbeat_timeout, job.stop_grace, job.hang_timeout) == (30.0, 0.0, 600.0)


def test_defaults_come_from_the_model_when_keys_are_absent() -> None:
    job = job_from_text("name: t\nmodule: m\n", "j.yaml")
    assert (job.nnodes, job.nproc_per_node, job.workdir, job.backend, job.sync) == (None, None, None, None, False)
    assert job.hang_timeout is None  # off: a silent but healthy phase is never killed by default
    assert (job.env, job.secrets, job.args) == ({}, {}, ())


def test_script_is_kept_relative_and_checked_against_the_current_directory(in_project: Path) -> None:
    (in_project / "jobs" / "x.yaml").write_text(RESNET)
    assert load_job("jobs/x.yaml").script == "jobs/train_resnet50.py"


def test_key_lines_are_recorded_for_later_errors() -> None:
    job = job_from_text(RESNET, "j.yaml")
    assert (job.lines["nnodes"], job.lines["select"], job.lines["select.names"]) == (4, 10, 10)


def test_unreadable_job_file_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as caught:
        load_job("missing.yaml")
    assert str(caught.value) == "cannot read job file missing.yaml: No such file or directory"


def test_unknown_key_suggests_closest_valid_key() -> None:
    text = "name: t\nscript: jobs/train_resnet50.py\nnnodes: 2\nnproc_per_nod: 8\n"
    assert error(text) == "jobs/x.yaml:4: nproc_per_nod: unknown key (did you mean 'nproc_per_node'?)"


def test_unknown_key_with_nothing_close_lists_the_valid_keys() -> None:
    assert error(RESNET + "colour: blue\n") == (
        "jobs/x.yaml:12: colour: unknown key (valid keys: name, script, module, args, nnodes, nproc_per_node, "
        f"workdir, env, rendezvous, max_restarts, select, telemetry, sync, sync_max_size, backend, "
        f"{', '.join(registry.names())}, "
        "heartbeat_timeout, stop_grace, hang_timeout, flight_recorder, restarts, checkpoint_dir, spares, "
        "fault_tolerance)"
    )


def test_missing_script_points_at_the_script_line_and_the_current_directory(in_project: Path) -> None:
    assert error(RESNET.replace("train_resnet50.py", "train_vit.py")) == (
        f"jobs/x.yaml:2: script: file not found: jobs/train_vit.py (path is relative to the current directory "
        f"{in_project}; run distrun from the directory the job expects, or give an absolute path)"
    )


def test_missing_absolute_script_is_not_explained_as_relative() -> None:
    assert error("name: t\nscript: /nonexistent/train.py\n") == (
        "jobs/x.yaml:2: script: file not found: /nonexistent/train.py (check the path)"
    )


def test_script_that_is_a_directory_is_refused() -> None:
    assert error("name: t\nscript: jobs\n").startswith("jobs/x.yaml:2: script: is a directory, not a file: jobs (")


@pytest.mark.parametrize("script", ["~nosuchuser123/train.py", "x" * 300 + ".py"])
def test_unusual_script_paths_are_reported_not_raised(script: str) -> None:
    assert error(f"name: t\nscript: {script}\n").startswith("jobs/x.yaml:2: script: ")


def replace_line(prefix: str, new: str) -> str:
    """RESNET with the line starting with `prefix` replaced by `new` (same line number)."""
    lines = RESNET.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    lines[index] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("prefix", "line", "expected"),
    [
        ("nnodes", "nnodes: two", "jobs/x.yaml:4: nnodes: must be an integer, got string 'two'"),
        ("nnodes", "nnodes: -2", "jobs/x.yaml:4: nnodes: must be an integer >= 1, got -2"),
        ("nnodes", "nnodes: true", "jobs/x.yaml:4: nnodes: must be an integer, got boolean true"),
        ("nnodes", "nnodes: 2.0", "jobs/x.yaml:4: nnodes: must be an integer, got number 2.0"),
        ("nnodes", "nnodes:", "jobs/x.yaml:4: nnodes: must be an integer, got null"),
        (
            "nproc_per_node",
            "nproc_per_node: all",
            "jobs/x.yaml:5: nproc_per_node: must be 'auto' or an integer, got string 'all'",
        ),
        (
            "nproc_per_node",
            "nproc_per_node: 0",
            "jobs/x.yaml:5: nproc_per_node: must be 'auto' or an integer >= 1, got 0",
        ),
        (
            "workdir",
            "workdir: project",
            "jobs/x.yaml:6: workdir: must be an absolute path, got 'project' "
            "(the job runs in this directory on every host: write /path or ~/path)",
        ),
        (
            "env",
            'env: {URL: "https://${env:TOKEN}@host"}',
            "jobs/x.yaml:7: env.URL: ${env:...} must be the whole value "
            '(give the secret a variable of its own, e.g. URL_SECRET: "${env:NAME}")',
        ),
        (
            "env",
            'env: {TOKEN: "${env:1TOKEN}"}',
            "jobs/x.yaml:7: env.TOKEN: '1TOKEN' is not a valid variable name "
            "(use letters, digits and '_', not starting with a digit)",
        ),
        ("env", "env: {A: {B: c}}", "jobs/x.yaml:7: env.A: must be a string, got a mapping"),
        ("env", "env: [A=1]", "jobs/x.yaml:7: env: must be a mapping of variable names to values, got a list"),
        (
            "rendezvous",
            "rendezvous: {backend: static, port: 70000}",
            "jobs/x.yaml:8: rendezvous.port: must be 'auto' or an integer from 1 to 65535, got 70000",
        ),
        (
            "rendezvous",
            "rendezvous: {backend: c10, port: auto}",
            "jobs/x.yaml:8: rendezvous.backend: must be one of static, c10d, got string 'c10' (did you mean 'c10d'?)",
        ),
        (
            "rendezvous",
            "rendezvous: {backend: static, prot: auto}",
            "jobs/x.yaml:8: rendezvous.prot: unknown key (did you mean 'port'?)",
        ),
        ("max_restarts", "max_restarts: -1", "jobs/x.yaml:9: max_restarts: must be an integer >= 0, got -1"),
        (
            "select",
            "select: {names: node0}",
            "jobs/x.yaml:10: select.names: must be a list, got string 'node0' (write [a, b] or one '- item' a line)",
        ),
        (
            "telemetry",
            "telemetry: {interval: 0.1}",
            "jobs/x.yaml:11: telemetry.interval: must be a number from 0.25 to 3600, got 0.1 "
            "(seconds between two samples of each host)",
        ),
        (
            "telemetry",
            "telemetry: {interval: 1.0e+300}",
            "jobs/x.yaml:11: telemetry.interval: must be a number from 0.25 to 3600, got 1.0e+300 "
            "(seconds between two samples of each host)",
        ),
        (
            "telemetry",
            "telemetry: {interval: .inf}",
            "jobs/x.yaml:11: telemetry.interval: must be a finite number, got .inf",
        ),
        (
            "telemetry",
            "telemetry: {enabled: yes}",
            "jobs/x.yaml:11: telemetry.enabled: must be true or false, got 'yes' (write true or false)",
        ),
        (
            "telemetry",
            "telemetry: {enabled: 1}",
            "jobs/x.yaml:11: telemetry.enabled: must be true or false, got integer 1",
        ),
        ("telemetry", "telemetry: 2", "jobs/x.yaml:11: telemetry: must be a mapping, got integer 2"),
        (
            "args",
            "args: --steps 50",
            "jobs/x.yaml:3: args: must be a list, got string '--steps 50' (write [a, b] or one '- item' a line)",
        ),
        ("args", "args: [--steps, null]", "jobs/x.yaml:3: args[1]: must be a string, got null"),
        (
            "name",
            "name: res net",
            "jobs/x.yaml:1: name: invalid job name 'res net' "
            "(the name is part of job ids and file names: use letters, digits, '.', '_' and '-')",
        ),
    ],
)
def test_bad_value_is_reported_at_its_line_with_its_key_path(prefix: str, line: str, expected: str) -> None:
    assert error(replace_line(prefix, line)) == expected


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("sync: on", "jobs/x.yaml:12: sync: must be true or false, got 'on' (write true or false)"),
        (
            "backend: slrum",
            f"jobs/x.yaml:12: backend: must be one of {', '.join(registry.names())}, got string 'slrum' "
            "(did you mean 'slurm'?)",
        ),
        ("heartbeat_timeout: 0.5", "jobs/x.yaml:12: heartbeat_timeout: must be a number from 3 to 86400, got 0.5 "
                                   "(seconds of silence after which a host counts as lost; heartbeats go once a "
                                   "second, so a shorter timeout would call a busy host lost)"),
        ("heartbeat_timeout: 1.0e+300", "jobs/x.yaml:12: heartbeat_timeout: must be a number from 3 to 86400, "
                                        "got 1.0e+300 (seconds of silence after which a host counts as lost; "
                                        "heartbeats go once a second, so a shorter timeout would call a busy host "
                                        "lost)"),
        ("stop_grace: -1", "jobs/x.yaml:12: stop_grace: must be a number from 0 to 3600, got -1 "
                           "(seconds between SIGTERM and SIGKILL when a job is stopped)"),
        ("stop_grace: 1.0e+300", "jobs/x.yaml:12: stop_grace: must be a number from 0 to 3600, got 1.0e+300 "
                                 "(seconds between SIGTERM and SIGKILL when a job is stopped)"),
        ("hang_timeout: 0.5", "jobs/x.yaml:12: hang_timeout: must be a number from 1 to 604800, got 0.5 "
                              "(seconds without progress from any rank before the job is a hang)"),
        ("stop_grace: false", "jobs/x.yaml:12: stop_grace: must be a number, got boolean false"),
        ("slurm: [--exclusive]", "jobs/x.yaml:12: slurm: must be a mapping, got a list (the slurm backend's "
                                 "options, e.g. slurm: {key: value})"),
        ("module: pkg.train", "jobs/x.yaml:12: module: set either 'script' or 'module', not both"),
    ],
)
def test_bad_optional_key_is_reported_at_its_line(extra: str, expected: str) -> None:
    assert error(RESNET + extra + "\n") == expected


def test_missing_name_points_at_the_top_mapping() -> None:
    assert error("# a job\nscript: jobs/train_resnet50.py\n") == "jobs/x.yaml:2: missing required key 'name'"


def test_missing_script_and_module_explains_both() -> None:
    assert error("name: t\nnnodes: 1\n") == (
        "jobs/x.yaml:1: missing required key 'script' or 'module' "
        "('script: path/to/train.py' runs a file, 'module: package.module' runs python -m)"
    )


def test_module_must_be_a_dotted_python_name() -> None:
    assert error("name: t\nmodule: pkg/train.py\n") == (
        "jobs/x.yaml:2: module: not a Python module name: 'pkg/train.py' (write it like package.module)"
    )


def test_top_level_must_be_a_mapping() -> None:
    assert error("- name: t\n") == (
        "jobs/x.yaml:1: the top level must be a mapping of keys, got a list "
        "(a job needs at least 'name' and 'script' or 'module')"
    )


def test_empty_file_is_reported() -> None:
    assert error("") == "jobs/x.yaml:1: the file is empty (a job needs at least 'name' and 'script' or 'module')"


@pytest.mark.parametrize("path", SHIPPED_JOBS, ids=[path.name for path in SHIPPED_JOBS])
def test_every_shipped_job_file_is_valid(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert load_job(path.relative_to(REPO)).name



def test_restarts_checkpoint_dir_and_spares_are_read() -> None:
    job = job_from_text(RESNET + "restarts: {max: 2, backoff: 5, on: [hang]}\ncheckpoint_dir: /ckpt\nspares: 1\n",
                        "jobs/x.yaml")
    assert (job.restarts.max, job.restarts.backoff, job.restarts.on) == (2, 5.0, ("hang",))
    assert (job.checkpoint_dir, job.spares) == ("/ckpt", 1)


def test_restarts_on_defaults_to_host_lost_and_rank_failed() -> None:
    assert job_from_text(RESNET + "restarts: {max: 1}\n", "jobs/x.yaml").restarts.on == ("host-lost", "rank-failed")


@pytest.mark.parametrize("nnodes", ["1:2", "'1:2'", "' 1:2 '"])
def test_nnodes_min_max_is_read_as_written_not_as_yaml_base_60(nnodes: str) -> None:
    job = job_from_text(RESNET.replace("nnodes: 2", f"nnodes: {nnodes}"), "jobs/x.yaml")
    assert (job.min_nnodes, job.nnodes) == (1, 2)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("restarts: {max: 1, on: [lost]}", "jobs/x.yaml:12: restarts.on[0]: must be one of host-lost, rank-failed, "
                                          "hang, got string 'lost' (did you mean 'host-lost'?)"),
        ("restarts: {max: 1, on: []}", "jobs/x.yaml:12: restarts.on: must be a non-empty list, got a list (list the "
                                       "failures that restart the job: any of host-lost, rank-failed, hang)"),
        ("restarts: {max: -1}", "jobs/x.yaml:12: restarts.max: must be an integer from 0 to 1000, got -1"),
        ("restarts: {max: 1, backof: 2}", "jobs/x.yaml:12: restarts.backof: unknown key (did you mean 'backoff'?)"),
        ("restarts: {backoff: -2}", "jobs/x.yaml:12: restarts.backoff: must be a number from 0 to 3600, got -2 "
                                    "(seconds between a failed attempt and the next)"),
        ("restarts: 2", "jobs/x.yaml:12: restarts: must be a mapping, got integer 2"),
        ("spares: -1", "jobs/x.yaml:12: spares: must be an integer >= 0, got -1"),
        ("checkpoint_dir: ''", "jobs/x.yaml:12: checkpoint_dir: must not be empty (remove the key to use the "
                               "default)"),
    ],
)
def test_bad_restart_keys_are_reported_at_their_line(extra: str, expected: str) -> None:
    assert error(RESNET + extra + "\n") == expected


@pytest.mark.parametrize("nnodes", ["'2:1'", "'0:2'", "'a:2'", "1:2:3"])
def test_bad_nnodes_range_is_explained(nnodes: str) -> None:
    assert error(RESNET.replace("nnodes: 2", f"nnodes: {nnodes}")).startswith(
        "jobs/x.yaml:4: nnodes: must be an integer >= 1 or MIN:MAX, got ")
