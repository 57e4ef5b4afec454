"""Plan building is pure: exact torchrun argv and environment per host for a job + inventory."""

from __future__ import annotations

import json
import shlex

import pytest

from orchestrator.errors import UsageError
from orchestrator.facts import HostFacts
from orchestrator.plan import build_plan, choose_iface, choose_master_addr
from orchestrator.spec import inventory_from_text, job_from_text

INVENTORY = """
defaults:
  python: /opt/venv/bin/python
  env: {NCCL_DEBUG: INFO}
nodes:
  - {name: node0, host: 10.0.0.10, iface: ib0}
  - {name: node1, host: 10.0.0.11}
  - {name: node2, host: 10.0.0.12, env: {NCCL_DEBUG: WARN}}
"""


def job(text: str, tmp_path) -> object:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return job_from_text(f"name: demo\nscript: {script}\n{text}", str(tmp_path / "job.yaml"))


def plan_for(tmp_path, job_text: str = "", facts: dict[str, HostFacts] | None = None, env=None):
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    spec = job(job_text, tmp_path)
    return build_plan(
        spec, list(inv.nodes), facts or {}, job_id="demo-1", inventory_path="inv.yaml", master=inv.nodes[0],
        master_addr="10.0.0.10", master_port=29501, controller_cwd="/work/project",
        controller_env=env or {}, extra_args=["--lr", "0.1"],
    )


def test_static_plan_gives_each_host_its_node_rank_and_the_exact_torchrun_argv(tmp_path):
    facts = {"node1": HostFacts("node1", python="3.11.2")}
    plan = plan_for(tmp_path, "args: [--steps, '5']\nnproc_per_node: 4\n", facts)
    script = str(tmp_path / "train.py")
    assert [h.node_rank for h in plan.hosts] == [0, 1, 2]
    assert plan.hosts[1].argv == [
        "/opt/venv/bin/python", "-P", "~/.distrun/jobs/demo-1/bin/distrun_torchrun.py",
        "--log-dir", "~/.distrun/jobs/demo-1/node1/torchrun", "--nnodes", "3", "--nproc-per-node", "4",
        "--node-rank", "1", "--master-addr", "10.0.0.10", "--master-port", "29501",
        "--max-restarts", "0", "--redirects", "3", "~/.distrun/jobs/demo-1/bin/distrun_worker.py", script,
        "--steps", "5", "--lr", "0.1",
    ]
    assert plan.world_size == 12
    assert plan.first_rank("node2") == 8


def test_torchrun_runs_with_safe_paths_as_dash_p_on_python_3_11_and_as_its_program_alone_elsewhere(tmp_path):
    """Where the host's python may lack -P, distrun_torchrun.py drops its own directory from
    sys.path itself (tests/test_security_units.py runs it)."""
    facts = {"node0": HostFacts("node0", python="3.12.1"), "node1": HostFacts("node1", python="3.10.12")}
    plan = plan_for(tmp_path, "", facts)
    newer, older, unknown = (h.argv for h in plan.hosts)
    program = "~/.distrun/jobs/demo-1/bin/distrun_torchrun.py"
    assert newer[:3] == ["/opt/venv/bin/python", "-P", program]
    assert older[:2] == unknown[:2] == ["/opt/venv/bin/python", program]
    assert older[2:4] == ["--log-dir", "~/.distrun/jobs/demo-1/node1/torchrun"]


def test_the_dry_run_shows_the_programs_by_name_with_a_bare_tilde_that_a_shell_expands(tmp_path):
    """The line a user copies runs what the supervisor runs: `~` is left to the shell in the job's
    own paths (the supervisor expands those same words), and quoted in anything else."""
    plan = plan_for(tmp_path, "args: ['~/data']\n")
    line = plan.render().splitlines()[-1].strip()
    assert line.startswith("/opt/venv/bin/python ~/.distrun/jobs/demo-1/bin/distrun_torchrun.py "
                           "--log-dir ~/.distrun/jobs/demo-1/node2/torchrun --nnodes 3")
    assert " ~/.distrun/jobs/demo-1/bin/distrun_worker.py " in line and " '~/data' " in line
    assert shlex.split(line) == plan.hosts[2].argv


def test_flight_recorder_false_runs_the_script_itself_in_each_worker(tmp_path):
    argv = plan_for(tmp_path, "flight_recorder: false\n").hosts[0].argv
    assert argv[-3:] == [str(tmp_path / "train.py"), "--lr", "0.1"] and argv[-4] == "3"
    assert not any("distrun_worker" in word for word in argv)


def test_c10d_rendezvous_uses_endpoint_and_job_id_instead_of_node_rank(tmp_path):
    plan = plan_for(tmp_path, "rendezvous: {backend: c10d, port: 29501}\n")
    argv = plan.hosts[2].argv
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.10:29501"
    assert argv[argv.index("--rdzv-id") + 1] == "demo-1"
    assert "--node-rank" not in argv


def test_module_jobs_run_with_dash_m(tmp_path):
    spec = job_from_text("name: m\nmodule: pkg.train\n", str(tmp_path / "j.yaml"))
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    plan = build_plan(spec, [inv.nodes[0]], {}, job_id="m-1", inventory_path="inv.yaml", master=inv.nodes[0],
                      master_addr="10.0.0.10", master_port=29500, controller_cwd="/w", controller_env={})
    assert plan.hosts[0].argv[-3:] == ["~/.distrun/jobs/m-1/bin/distrun_worker.py", "-m", "pkg.train"]


def test_job_env_overrides_inventory_env_and_iface_sets_socket_ifnames(tmp_path):
    plan = plan_for(tmp_path, "env: {NCCL_DEBUG: TRACE, FOO: bar}\n")
    env0 = plan.hosts[0].env
    assert env0["NCCL_DEBUG"] == "TRACE"
    assert env0["FOO"] == "bar"
    assert env0["NCCL_SOCKET_IFNAME"] == env0["GLOO_SOCKET_IFNAME"] == "ib0"
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" not in env0  # lines come from per-rank files, not --tee


def test_every_job_has_the_flight_recorder_on_unless_the_env_sizes_it_and_names_the_socket_dir(tmp_path):
    env = plan_for(tmp_path, "env: {TORCH_NCCL_TRACE_BUFFER_SIZE: '50'}\n").hosts[1].env
    assert (env["TORCH_FR_BUFFER_SIZE"], env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) == ("2000", "50")
    assert env["DISTRUN_WORKER_SOCKETS"] == "~/.distrun/jobs/demo-1/sock"
    assert plan_for(tmp_path, "hang_timeout: 60\n").hosts[1].env["DISTRUN_WORKER_SOCKETS"]


def test_flight_recorder_false_leaves_the_ranks_environment_without_it(tmp_path):
    plain = plan_for(tmp_path, "hang_timeout: 60\nflight_recorder: false\n").hosts[1].env
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "DISTRUN_WORKER_SOCKETS"} & set(plain)


def test_the_flight_recorder_is_sized_in_the_variable_the_hosts_torch_reads(tmp_path):
    facts = {"node0": HostFacts("node0", torch="2.13.0+cpu"), "node1": HostFacts("node1", torch="2.5.1")}
    hosts = plan_for(tmp_path, "", facts).hosts
    sized = [{k for k in h.env if k.startswith("TORCH_") and k.endswith("BUFFER_SIZE")} for h in hosts]

    assert sized == [{"TORCH_FR_BUFFER_SIZE"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE"},
                     {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}]  # node2's torch is not known


def test_host_without_iface_gets_the_interface_on_the_masters_subnet(tmp_path):
    facts = {"node1": HostFacts("node1", interfaces={"lo": ["127.0.0.1/8"], "eth1": ["10.0.0.11/24"]},
                                route_iface="eth9")}
    plan = plan_for(tmp_path, facts=facts)
    assert plan.hosts[1].env["GLOO_SOCKET_IFNAME"] == "eth1"


def test_host_without_iface_falls_back_to_the_route_to_the_master(tmp_path):
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    facts = HostFacts("node2", interfaces={"eth0": ["192.168.1.5/24"]}, route_iface="eth0")
    assert choose_iface(inv.nodes[2], facts, "10.0.0.10") == "eth0"


def test_nproc_auto_uses_gpus_found_then_inventory_then_two_cpu_processes(tmp_path):
    facts = {"node0": HostFacts("node0", gpus=8)}
    plan = plan_for(tmp_path, facts=facts)
    assert [h.nproc for h in plan.hosts] == [8, 2, 2]


def test_secrets_reach_the_host_env_but_never_plan_json(tmp_path):
    plan = plan_for(tmp_path, 'env: {WANDB_API_KEY: "${env:MY_KEY}"}\n', env={"MY_KEY": "hunter2"})
    host = plan.hosts[0]
    assert plan.host_env(host)["WANDB_API_KEY"] == "hunter2"
    dumped = json.dumps(plan.to_dict())
    assert "hunter2" not in dumped
    assert plan.to_dict()["hosts"][0]["env"]["WANDB_API_KEY"] == "***"
    assert "hunter2" not in plan.render()
    assert "WANDB_API_KEY=***" in plan.render()


def test_missing_secret_variable_is_a_usage_error_naming_it(tmp_path):
    with pytest.raises(UsageError, match=r"\$\{env:MY_KEY\} is not set"):
        plan_for(tmp_path, 'env: {WANDB_API_KEY: "${env:MY_KEY}"}\n', env={})


def test_loopback_master_address_is_refused_when_several_hosts_take_part():
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    with pytest.raises(UsageError, match="loopback"):
        choose_master_addr(inv.nodes[1], None, "127.0.0.1", nnodes=2)
    assert choose_master_addr(inv.nodes[1], None, "127.0.0.1", nnodes=1) == "127.0.0.1"


def test_master_iface_address_is_preferred_over_the_ssh_address():
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    facts = HostFacts("node0", interfaces={"ib0": ["192.168.50.10/24"]})
    assert choose_master_addr(inv.nodes[0], facts, "10.0.0.10", nnodes=3) == "192.168.50.10"


def test_every_rank_gets_the_attempt_and_the_checkpoint_dir_and_the_plan_names_the_spares(tmp_path):
    inv = inventory_from_text(INVENTORY, "inv.yaml")
    spec = job("checkpoint_dir: /shared/ckpt\nrestarts: {max: 1}\n", tmp_path)
    plan = build_plan(spec, list(inv.nodes[:2]), {}, job_id="demo-1", inventory_path="inv.yaml", master=inv.nodes[0],
                      master_addr="10.0.0.10", master_port=29501, controller_cwd="/w", controller_env={},
                      attempt=3, spares=("node2",))
    assert all(h.env["DISTRUN_ATTEMPT"] == "3" and h.env["DISTRUN_CHECKPOINT_DIR"] == "/shared/ckpt"
               for h in plan.hosts)
    assert (plan.attempt, plan.checkpoint_dir) == (3, "/shared/ckpt")
    assert "spares: node2 (take a failed host's place when the job restarts)" in plan.render()


def test_without_checkpoint_dir_the_first_attempt_is_still_numbered(tmp_path):
    host = plan_for(tmp_path).hosts[0]
    assert host.env["DISTRUN_ATTEMPT"] == "1" and "DISTRUN_CHECKPOINT_DIR" not in host.env
