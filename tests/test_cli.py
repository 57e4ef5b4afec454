"""The `distrun` command line as an operator meets it: help, host flags, ps, references, completion,
dry runs that reach no host, bad combinations, prune. No test host and no torchrun here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.liveness import process_start
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun

# Options whose long name means something else on some commands, so their words differ there.
# logs --since: lines, not jobs; stack --node/--rank: whose stacks to dump (one), not which lines to show;
# stop --all: every running job (stop takes no inventory)
MEANS_OTHER_THINGS = {"--all": {"ps", "stop"}, "--dry-run": {"prune"}, "--since": {"logs"}, "--node": {"stack"},
                      "--rank": {"stack"}}
CLOSED_PORT_INVENTORY = ("defaults: {user: root, port: 1, host_key_policy: strict}\n"
                         "nodes:\n  - {name: node0, host: 127.0.0.1}\n  - {name: node1, host: 127.0.0.1}\n")


def commands() -> dict[str, click.Command]:
    return dict(cli.commands)


def help_text(*words: str) -> str:
    result = CliRunner().invoke(cli, [*words, "--help"], prog_name="distrun", terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


# ---------------------------------------------------------------- help


def test_every_commands_help_has_examples_and_its_summary_is_whole() -> None:
    for name, command in commands().items():
        text = help_text(name)
        assert "Examples:\n" in text and f"distrun {name}" in text.split("Examples:")[1], name
        assert command.short_help and not command.short_help.endswith(("...", "…")), name
    listing = help_text()
    assert "…" not in listing and "..." not in listing.split("Commands:")[1].split("Exit codes:")[0]


def test_the_top_help_lists_exit_codes_environment_and_completion() -> None:
    text = help_text()
    for code in ("0 ", "1 ", "2 ", "3 ", "130", "143"):
        assert f"\n    {code}" in text, code
    for variable in ("DISTRUN_INVENTORY", "DISTRUN_HOME", "DISTRUN_SSH_CONFIG", "DISTRUN_SSH_TIMEOUT", "NO_COLOR",
                     "XDG_CONFIG_HOME"):
        assert variable in text
    assert 'eval "$(distrun completion bash)"' in text


def test_an_option_has_the_same_words_on_every_command() -> None:
    words: dict[str, dict[str, str]] = {}
    for name, command in commands().items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in (o for o in param.opts if o.startswith("--")):
                    if name not in MEANS_OTHER_THINGS.get(opt, ()):
                        words.setdefault(opt, {})[name] = param.help or ""
    differing = {opt: by_command for opt, by_command in words.items() if len(set(by_command.values())) > 1}
    assert differing == {}
    assert {"launch", "doctor", "exec", "stop", "bench"} <= set(words["--nodes"])
    assert set(words["--nodes"]) == set(words["--exclude"]) == set(words["--label"]) == set(words["--all"]) | {"stop"}


@pytest.mark.parametrize(("args", "hint"), [
    (["ps", "--lr"], None), (["launch", "jobs/tiny.yaml", "--lr", "0.1"], None), (["ps", "--al"], "--all"),
    (["logs", "--folow"], "--follow"), (["launch", "jobs/tiny.yaml", "--nodse", "x"], "--nodes"),
    (["launch", "jobs/tiny.yaml", "--nprocs-per-node", "2"], "--nproc-per-node")])
def test_an_unknown_option_is_hinted_only_with_options_a_typo_or_two_away(args: list[str], hint: str | None,
                                                                          tmp_path: Path) -> None:
    result = distrun(*args, home=tmp_path)

    said = re.findall(r"did you mean ([^?]*)\?", result.stderr, re.I)
    assert result.returncode == 2 and said == ([hint] if hint else []), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_stop_all_says_every_running_job_not_an_inventory_stop_does_not_take() -> None:
    all_help = help_text("stop").split("Options:")[1].split("--all", 1)[1].split("--json")[0]

    assert "running job" in all_help and "inventory" not in all_help
    assert "-i" not in {opt for p in cli.commands["stop"].params for opt in p.opts}


def test_help_names_values_as_users_read_them_never_clicks_types_or_ranges() -> None:
    for name in commands():
        text = help_text(name)
        raw = re.findall(r"INTEGER|FLOAT|TEXT|PATH|(?<!--nodes )(?<!--exclude )RANGE|\[x[<>]", text)
        assert raw == [], f"distrun {name} --help shows {raw}"
    assert "--timeout SECONDS" in help_text("exec") and "--tail N" in help_text("logs")


# ---------------------------------------------------------------- launch's command line


def test_a_script_option_without_the_double_dash_says_to_put_it_after_one(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/train_resnet50.py", "--steps", "20", home=tmp_path)

    assert result.returncode == 2
    assert ("--steps: not an option of distrun launch. Arguments for the training script go after `--`: "
            "distrun launch jobs/train_resnet50.py [OPTIONS] -- --steps ...") in result.stderr
    assert "--time" not in result.stderr and "Traceback" not in result.stderr


def test_usage_errors_are_one_line_naming_the_commands_help(tmp_path: Path) -> None:
    for args in (("logs",), ("ps", "--bogus"), ("launch", "jobs/tiny.yaml", "--nnodes", "3:1")):
        result = distrun(*args, home=tmp_path)
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("distrun: error: "), result.stderr
        assert f"(see `distrun {args[0]} --help`)" in result.stderr


@pytest.mark.parametrize(("word", "command"), [("run", "launch"), ("submit", "launch"), ("status", "ps"),
                                               ("queue", "ps"), ("cancel", "stop")])
def test_other_tools_words_for_a_command_name_distruns_command(tmp_path: Path, word: str, command: str) -> None:
    result = distrun(word, "last", home=tmp_path)

    assert result.returncode == 2
    assert result.stderr == (f"distrun: error: no command {word!r}: distrun's is `{command}` "
                             f"(distrun {command} --help)\n")


def test_a_near_miss_never_suggests_a_command_that_stops_or_removes(tmp_path: Path) -> None:
    for word in ("prun", "prunes", "stpo", "sto"):
        result = distrun(word, home=tmp_path)
        assert result.returncode == 2 and "prune" not in result.stderr.replace(repr(word), "")
        assert "'stop'" not in result.stderr
    assert "did you mean 'logs'?" in distrun("lgos", home=tmp_path).stderr
    assert "--help" in complete("distrun lgos --", tmp_path), "completion after an unknown command is no error"


@pytest.mark.parametrize(("args", "hint"), [
    (("-N", "2"), "Slurm's node count; distrun's is --nnodes K"),
    (("--standalone",), "for one host give --nnodes 1 or --backend local"),
    (("--master-port", "29500"), "to fix the port set `rendezvous: {port: N}` in the job file"),
    (("--master_addr=node0",), "distrun picks the master and a free port itself"),
    (("--nodes", "2"), "--nodes takes host names (a range like 'node[0-1]'); for 2 hosts give --nnodes 2"),
    (("--rdzv-backend", "c10d"), "distrun runs torchrun's c10d rendezvous itself (its --backend is where the job runs"),
    (("--max-restarts", "3"), "`restarts: {max: N}` in the job file"),
    (("-w", "node[0-1]"), "pdsh's host list; distrun's is --nodes RANGE"),
])
def test_torchrun_and_slurm_habits_get_a_hint_naming_the_distrun_flag(tmp_path: Path, args: tuple[str, ...],
                                                                      hint: str) -> None:
    result = distrun("launch", "jobs/train_resnet50.py", *args, "--dry-run", home=tmp_path)

    assert result.returncode == 2 and hint in result.stderr and "go after `--`" not in result.stderr


@pytest.mark.parametrize(("command", "args", "hint"), [
    ("exec", ("-w", "node1", "true"), "-w: not an option of distrun (pdsh's host list; distrun's is --nodes RANGE"),
    ("exec", ("-a", "true"), "-a: not an option of distrun (pdsh's every host; distrun's is --all)"),
    ("doctor", ("-w", "node1"), "-w: not an option of distrun (pdsh's host list; distrun's is --nodes RANGE"),
])
def test_pdsh_host_flags_get_distruns_spelling_on_every_command(tmp_path: Path, command: str,
                                                                args: tuple[str, ...], hint: str) -> None:
    result = distrun(command, *args, home=tmp_path)

    assert (result.returncode, result.stderr.count("\n")) == (2, 1) and hint in result.stderr


def test_a_script_launch_takes_the_job_keys_workdir_and_sync_as_flags(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/train_resnet50.py", "--workdir", "/srv/x", "--sync", "--dry-run", home=tmp_path)

    assert result.returncode == 0, result.stderr
    assert ", workdir: /srv/x, sync: true}\n" in result.stdout
    refused = distrun("launch", "jobs/train_resnet50.py", "--workdir", "srv/x", "--dry-run", home=tmp_path)
    assert (refused.returncode, refused.stderr) == (2, "distrun: error: --workdir 'srv/x': must be an absolute path "
                                                       "(the job runs in this directory on every host: write /path "
                                                       "or ~/path)\n")


def test_torchruns_underscore_spelling_of_nproc_per_node_is_accepted(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/tiny.yaml", "--nproc_per_node", "3", "--dry-run", home=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "--nproc-per-node 3 " in result.stdout


def test_an_nnodes_range_is_accepted_on_the_command_line_as_in_a_job_file(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/train_resnet50.py", "--nnodes", "1:3", "--dry-run", home=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "nnodes: '1:3'" in result.stdout and "1 node(s)" in result.stdout


def test_the_local_backend_refuses_an_inventory_it_would_ignore(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/tiny.yaml", "--backend", "local", "-i", "inventory/example.yaml",
                     "--dry-run", home=tmp_path)

    assert result.returncode == 2
    assert "--backend local runs on this machine only, so -i inventory/example.yaml would be ignored" in result.stderr


def test_a_dry_run_reaches_no_host_and_marks_what_only_a_probe_gives(tmp_path: Path) -> None:
    inventory = tmp_path / "closed.yaml"
    inventory.write_text(CLOSED_PORT_INVENTORY)

    offline = distrun("launch", "jobs/tiny.yaml", "-i", str(inventory), "--dry-run", home=tmp_path / "home")
    probed = distrun("launch", "jobs/tiny.yaml", "-i", str(inventory), "--dry-run", "--probe",
                     home=tmp_path / "home", env={"DISTRUN_SSH_TIMEOUT": "2"})

    assert offline.returncode == 0, offline.stderr
    assert "world size <probe>, master node0 at <probe>:<probe>" in offline.stdout
    assert "--nproc-per-node <probe> --node-rank 1 --master-addr <probe> --master-port <probe>" in offline.stdout
    assert "iface <probe>" in offline.stdout
    assert probed.returncode == 3
    assert "node[0-1]: unreachable: connection refused" in probed.stderr
    assert "(fix: check the host is up and `ssh USER@HOST` works" in probed.stderr


def test_a_script_dry_run_prints_a_job_file_that_launches_the_same_job(tmp_path: Path) -> None:
    result = distrun("launch", "jobs/train_resnet50.py", "--name", "smoke", "--nnodes", "1", "--nproc-per-node",
                     "2", "--env", "OMP_NUM_THREADS=1", "--dry-run", "--", "--steps", "3", home=tmp_path)
    saved = tmp_path / "smoke.yaml"
    saved.write_text(result.stdout)

    again = distrun("launch", str(saved), "--dry-run", home=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "name: smoke\nscript: jobs/train_resnet50.py\nargs: [--steps, '3']\nnnodes: 1\nnproc_per_node: 2\n" \
           "env: {OMP_NUM_THREADS: '1'}\n" in result.stdout
    plan_line = next(line for line in result.stdout.splitlines() if "distrun_torchrun.py" in line)
    assert plan_line.startswith("#   ") and plan_line.endswith("jobs/train_resnet50.py --steps 3")
    assert again.returncode == 0, again.stderr
    same_id = re.compile(r"/jobs/[^/]+/")  # each launch is a job of its own: its id names its host directory
    assert same_id.sub("/jobs/ID/", plan_line.removeprefix("# ")) in same_id.sub("/jobs/ID/", again.stdout)


def test_probe_and_json_are_refused_where_they_mean_nothing(tmp_path: Path) -> None:
    probe = distrun("launch", "jobs/tiny.yaml", "--probe", home=tmp_path)
    as_json = distrun("launch", "jobs/tiny.yaml", "--json", home=tmp_path)

    assert probe.returncode == 2 and "--probe: only with --dry-run" in probe.stderr
    assert as_json.returncode == 2 and "--json: only with --detach" in as_json.stderr


def test_a_detached_launch_that_fails_leaves_no_job_directory(tmp_path: Path) -> None:
    inventory = tmp_path / "closed.yaml"
    inventory.write_text(CLOSED_PORT_INVENTORY)
    home = tmp_path / "home"

    result = distrun("launch", "jobs/tiny.yaml", "-i", str(inventory), "--detach", home=home,
                     env={"DISTRUN_SSH_TIMEOUT": "2"})

    assert result.returncode == 3
    assert "unreachable: connection refused" in result.stderr
    assert not (home / "jobs").exists() or list((home / "jobs").iterdir()) == []


def test_a_detached_launch_with_a_bad_selection_fails_before_starting_anything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = distrun("launch", "jobs/tiny.yaml", "--nodes", "nod1", "--detach", home=home)

    assert result.returncode == 2 and "--nodes: unknown node 'nod1' in inventory <built-in>" in result.stderr
    assert not (home / "jobs").exists()


# ---------------------------------------------------------------- ps, references


def record(store: Store, job_id: str, started: float, hosts: list[str], state: JobState = JobState.SUCCEEDED,
           internal: bool = False) -> JobRecord:
    rec = JobRecord(id=job_id, name=job_id.rsplit("-", 3)[0], spec_path="jobs/tiny.yaml", inventory="<built-in>",
                    hosts=hosts, state=state, started=started, ended=started + 75, exit_code=0, internal=internal,
                    backend="slurm")  # slurm: no controller pid to check, records stay as written
    store.save(rec)
    return rec


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    store = Store(home)
    now = time.time()
    record(store, "tiny-20261121-141109-60ee", now - 3 * 86400, [f"node{i}" for i in range(64)])
    record(store, "doctor-bandwidth-20261122-090000-77aa", now - 7200, ["node0", "node1"], internal=True)
    record(store, "tiny-20261123-101500-a1b2", now - 600, ["node0", "node2"], JobState.FAILED)
    return home


def test_ps_folds_hosts_and_shows_when_each_job_started(jobs: Path) -> None:
    result = distrun("ps", home=jobs)

    lines = result.stdout.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "STARTED", "TIME", "EXIT", "HOSTS"]
    assert lines[1].startswith("tiny-20261123-101500-a1b2  failed") and lines[1].endswith("node[0,2]")
    assert lines[2].endswith("node[0-63]") and len(lines[2]) < 100
    assert len(lines) == 3, "the internal run is not a user job"
    recorded = Store(jobs).get("tiny-20261123-101500-a1b2").started  # the fixture's time, not the clock's now
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(recorded)) in lines[1]


def test_ps_all_lists_internal_runs_in_straight_columns(jobs: Path) -> None:
    lines = distrun("ps", "--all", home=jobs).stdout.splitlines()

    internal = next(line for line in lines if line.startswith("doctor-bandwidth"))
    assert internal.endswith("node[0-1]  (internal)")
    state_column = lines[0].index("STATE")
    assert all(line[state_column - 2:state_column] == "  " and line[state_column] != " " for line in lines[1:])


def test_ps_filters_by_state_and_start_and_prints_json(jobs: Path) -> None:
    failed = distrun("ps", "--state", "failed", "--json", home=jobs)
    recent = distrun("ps", "--since", "1d", home=jobs)
    bad = distrun("ps", "--state", "faild", home=jobs)

    assert [r["id"] for r in json.loads(failed.stdout)] == ["tiny-20261123-101500-a1b2"]
    assert [line.split()[0] for line in recent.stdout.splitlines()[1:]] == ["tiny-20261123-101500-a1b2"]
    assert bad.returncode == 2 and "--state faild: not a state (did you mean 'failed'?)" in bad.stderr


def test_ps_colours_states_only_when_asked_or_on_a_terminal(jobs: Path) -> None:
    plain = distrun("ps", home=jobs)
    forced = distrun("--color", "always", "ps", home=jobs)
    forced_here = distrun("ps", "--color", "always", home=jobs, env={"NO_COLOR": "1"})

    assert "\x1b[" not in plain.stdout
    assert "\x1b[31mfailed" in forced.stdout and "\x1b[31mfailed" in forced_here.stdout


def test_last_skips_internal_runs_and_an_ambiguous_prefix_lists_candidates_newest_first(jobs: Path) -> None:
    last = distrun("logs", "last", home=jobs)
    ambiguous = distrun("logs", "tiny-2026", home=jobs)

    assert last.returncode == 0
    assert ambiguous.returncode == 2
    assert ("'tiny-2026' matches 2 jobs, newest first: tiny-20261123-101500-a1b2, tiny-20261121-141109-60ee"
            in ambiguous.stderr)


def test_logs_group_of_a_job_without_replica_groups_is_one_line_with_exit_2(jobs: Path) -> None:
    result = distrun("logs", "last", "--group", "0", home=jobs)

    assert result.returncode == 2
    assert result.stderr.endswith("has no replica groups (only a job with fault_tolerance: has them)\n")
    assert len(result.stderr.splitlines()) == 1


# ---------------------------------------------------------------- completion


def complete(words: str, home: Path, **env: str) -> list[str]:
    parts = words.split(" ")
    result = distrun(*parts[1:2], home=home, env={"_DISTRUN_COMPLETE": "bash_complete", "COMP_WORDS": words,
                                                   "COMP_CWORD": str(len(parts) - 1), **env})
    return [line.split(",", 1)[1] for line in result.stdout.splitlines() if "," in line]


def test_completion_scripts_for_bash_zsh_and_fish(tmp_path: Path) -> None:
    bash = distrun("completion", "bash", home=tmp_path)
    checked = subprocess.run(["bash", "-n"], input=bash.stdout, text=True, capture_output=True)

    assert bash.returncode == 0 and "_DISTRUN_COMPLETE=bash_complete" in bash.stdout
    assert checked.returncode == 0, checked.stderr
    assert "compdef" in distrun("completion", "zsh", home=tmp_path).stdout
    assert "complete --no-files --command distrun" in distrun("completion", "fish", home=tmp_path).stdout


def test_completion_offers_job_ids_and_node_names(jobs: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("nodes: [{name: node0, labels: [h100]}, {name: node1}, {name: gpu-b, labels: [a100]}]\n")

    assert complete("distrun logs tiny-2026112", jobs) == ["tiny-20261123-101500-a1b2", "tiny-20261121-141109-60ee"]
    assert complete("distrun stop l", jobs) == ["last"]
    assert complete(f"distrun exec -i {inventory} --nodes no", jobs) == ["node0", "node1"]
    assert complete(f"distrun exec -i {inventory} --nodes node0,g", jobs) == ["node0,gpu-b"]
    assert complete(f"distrun doctor -i {inventory} --label a", jobs) == ["a100"]


# ---------------------------------------------------------------- stop, prune


def test_stop_needs_a_job_or_hosts_and_not_both(jobs: Path) -> None:
    neither = distrun("stop", home=jobs)
    both = distrun("stop", "last", "--nodes", "node0", home=jobs)
    nobody = distrun("stop", "--nodes", "node9", home=jobs)

    assert neither.returncode == 2 and "stop: which job?" in neither.stderr
    assert both.returncode == 2 and "give a job or hosts" in both.stderr
    assert nobody.returncode == 0 and "no running job on those hosts" in nobody.stderr


def test_stop_json_on_a_finished_job_says_so(jobs: Path) -> None:
    result = distrun("stop", "tiny-20261121", "--json", home=jobs)

    assert result.returncode == 0
    assert json.loads(result.stdout) == {"id": "tiny-20261121-141109-60ee", "state": "succeeded", "exit_code": 0,
                                         "messages": ["job tiny-20261121-141109-60ee already ended (succeeded)"],
                                         "gpus_freed": []}


def test_stop_json_exit_code_is_the_jobs_exit_code_as_ps_shows_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store(home).save(JobRecord(id="tiny-20261124-101500-c3d4", name="tiny", spec_path="jobs/tiny.yaml",
                               inventory="<built-in>", hosts=["node0"], state=JobState.STOPPED, exit_code=143,
                               backend="slurm"))

    stopped = json.loads(distrun("stop", "last", "--json", home=home).stdout)
    listed = json.loads(distrun("ps", "--json", home=home).stdout)

    assert stopped["exit_code"] == listed[0]["exit_code"] == 143


def test_prune_removes_old_finished_jobs_here_and_on_the_host_never_a_running_one(tmp_path: Path) -> None:
    home, host_home = tmp_path / "home", tmp_path / "host-home"
    store = Store(home)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "orchestrator"])
    now = time.time()
    jobs = {"old": now - 10 * 86400, "recent": now - 3600, "running": now - 30 * 86400}
    for name, started in jobs.items():
        rec = JobRecord(id=f"{name}-1", name=name, spec_path="j.yaml", inventory="<built-in>", hosts=["localhost"],
                        backend="local", started=started,
                        state=JobState.RUNNING if name == "running" else JobState.SUCCEEDED,
                        ended=None if name == "running" else started + 60, controller_pid=controller.pid,
                        controller_start=process_start(controller.pid))
        store.save(rec)
        store.job_dir(rec.id).create()
        (host_home / ".distrun" / "jobs" / rec.id).mkdir(parents=True)
        (host_home / ".distrun" / "jobs" / rec.id / "localhost.log").write_text("line\n")

    try:
        listed = distrun("prune", "--dry-run", home=home, env={"HOME": str(host_home)})
        pruned = distrun("prune", "--json", home=home, env={"HOME": str(host_home)})
    finally:
        controller.kill()
        controller.wait()

    assert listed.returncode == 0 and listed.stdout == "would remove 1 job(s)\n  old-1\n"
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout) == {"removed": ["old-1"], "kept": {}, "dry_run": False}
    assert sorted(p.name for p in (home / "jobs").iterdir()) == ["recent-1", "running-1"]
    assert sorted(p.name for p in (host_home / ".distrun" / "jobs").iterdir()) == ["recent-1", "running-1"]
    assert [r.id for r in Store(home).list()] == ["recent-1", "running-1"]


def test_prune_of_jobs_whose_hosts_are_gone_names_local_which_forgets_them_here_only(tmp_path: Path) -> None:
    home, inventory = tmp_path / "home", tmp_path / "gone.yaml"
    inventory.write_text(CLOSED_PORT_INVENTORY)
    ended = time.time() - 10 * 86400
    Store(home).save(JobRecord(id="gone-1", name="gone", spec_path="j.yaml", inventory=str(inventory),
                               hosts=["node0", "node1"], backend="ssh", state=JobState.SUCCEEDED, started=ended,
                               ended=ended + 60))
    Store(home).job_dir("gone-1").create()
    slow = {"DISTRUN_SSH_TIMEOUT": "2"}

    refused = distrun("prune", home=home, env=slow)
    forgotten = distrun("prune", "--local", home=home, env=slow)

    assert refused.returncode == 3 and refused.stderr.startswith("kept gone-1: ")
    assert "`distrun prune --local` with the same options forgets those jobs here only" in refused.stderr
    assert forgotten.returncode == 0 and forgotten.stdout == "removed 1 job(s)\n  gone-1\n", forgotten.stderr
    assert Store(home).list() == [] and not (home / "jobs" / "gone-1").exists()


def test_stop_of_a_job_whose_hosts_left_the_inventory_is_one_line_naming_them_and_exit_2(tmp_path: Path) -> None:
    home, inventory = tmp_path / "home", tmp_path / "inv.yaml"
    inventory.write_text(CLOSED_PORT_INVENTORY)
    Store(home).save(JobRecord(id="moved-1", name="moved", spec_path="j.yaml", inventory=str(inventory),
                               hosts=["node0", "node7"], backend="ssh", state=JobState.RUNNING, started=time.time(),
                               controller_pid=None))

    result = distrun("stop", "moved-1", home=home, env={"DISTRUN_SSH_TIMEOUT": "2"})

    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"ran on node7, which {inventory} no longer lists" in result.stderr


def test_the_background_controller_gets_the_script_arguments_untouched() -> None:
    from orchestrator.cli.launch import _child_argv

    assert _child_argv(["launch", "t.py", "--detach", "--json", "--", "--json", "--detach"]) == \
        ["launch", "t.py", "--", "--json", "--detach"]


def test_hosts_sharing_one_home_prune_the_same_job_copy_at_once_without_an_error(tmp_path: Path) -> None:
    """Hosts on one NFS home (and the namespace test cluster) prune one copy together; a file the
    other host removed first is not an error (CI failed once with FileNotFoundError: 'node0.err')."""
    copy = tmp_path / ".distrun" / "jobs" / "job-1"
    for node in range(20):
        (copy / f"node{node}").mkdir(parents=True)
        for n in range(100):
            (copy / f"node{node}" / f"{n}.log").write_text("line\n")
    prune = [sys.executable, "-c", "import sys; from orchestrator.remote.prune import main; main(sys.argv[1:])",
             "job-1"]
    env = {"HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen(prune, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    results = [(p.wait(timeout=60), *p.communicate()) for p in procs]

    assert [(rc, err) for rc, _, err in results] == [(0, "")] * 6
    assert not copy.exists()


def test_a_missing_job_inventory_or_script_file_suggests_the_near_name_of_its_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "tiny.yaml").write_text("name: tiny\nscript: train.py\n")
    (tmp_path / "lab.yaml").write_text("nodes:\n  - {name: node0, host: 127.0.0.1}\n")
    at = str(tmp_path)

    asked = {f"{at}/tiyn.yaml": f"{at}/tiny.yaml", f"{at}/trian.py": f"{at}/train.py", f"{at}/zzz.py": None}
    for target, meant in asked.items():
        result = distrun("launch", target, "--dry-run", home=tmp_path / "home")
        hint = f"(did you mean {meant}?)" if meant else "did you mean"
        assert result.returncode == 2 and (hint in result.stderr) == bool(meant), result.stderr
    result = distrun("launch", f"{at}/tiny.yaml", "-i", f"{at}/lba.yaml", "--dry-run", home=tmp_path / "home")
    assert result.returncode == 2 and result.stderr.strip().endswith(f"(did you mean {at}/lab.yaml?)"), result.stderr
