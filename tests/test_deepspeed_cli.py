"""A DeepSpeed user's habits at the command line: a hostfile as `-i` (bad lines in one line, exit 2;
`slots` as the processes per host) and the `deepspeed` launcher's flags with distrun's spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan import resolve_nproc
from orchestrator.spec import job_from_text, load_inventory
from tests.helpers import distrun


@pytest.mark.parametrize(("args", "hint"), [
    (("--hostfile", "hf"), "--hostfile: not an option of distrun launch (DeepSpeed's hostfile; distrun reads it "
                           "as the inventory: -i HOSTFILE)"),
    (("--include", "w1@w2"), "distrun's is --nodes RANGE"),
    (("--num_nodes", "2"), "DeepSpeed's node count; distrun's is --nnodes K"),
    (("--num_gpus=2",), "distrun's is --nproc-per-node N, or slots=N in a hostfile given as -i"),
    (("--master_port", "29600"), "to fix the port set `rendezvous: {port: N}`"),
    (("--launcher", "pdsh"), "distrun's is --backend ssh|local|slurm"),
])
def test_deepspeed_launcher_flags_get_distruns_spelling(tmp_path: Path, args: tuple[str, ...], hint: str) -> None:
    result = distrun("launch", "jobs/deepspeed.yaml", *args, "--dry-run", home=tmp_path)

    assert (result.returncode, result.stderr.count("\n")) == (2, 1) and hint in result.stderr, result.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("# lab\nworker-1 slots=2\n\nworker-2 slots=x  # bad\n",
     "HOSTFILE:4: slots=x for host 'worker-2' is not a positive integer"),
    ("worker-1 slots=2\nworker-1 slots=4\n", "HOSTFILE:2: host 'worker-1' is listed twice (the first is at line 1"),
    ("worker-1 slots=2\n  slots=2\n", "HOSTFILE:2: no host before 'slots=2'"),
    ("worker-1 slots=2\nworker-2 slots=2 gpus=1\n", "HOSTFILE:2: 'worker-2 slots=2 gpus=1' is not a hostfile line"),
])
def test_bad_hostfile_line_is_one_line_with_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)

    result = distrun("launch", "jobs/deepspeed.yaml", "-i", str(hostfile), "--dry-run", home=tmp_path)

    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stderr
    assert expected.replace("HOSTFILE", str(hostfile)) in result.stderr


def test_hostfile_slots_are_the_processes_per_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# DeepSpeed's format\n10.0.0.1 slots=3   # first\n\nworker-2 slots=1\n")
    inventory = load_inventory(hostfile)
    auto = job_from_text("name: j\nscript: jobs/deepspeed_zero.py\nnproc_per_node: auto\n", "j.yaml")
    fixed = job_from_text("name: j\nscript: jobs/deepspeed_zero.py\nnproc_per_node: 2\n", "j.yaml")

    assert [(n.name, n.host, n.slots, n.line) for n in inventory.nodes] == [("10.0.0.1", "10.0.0.1", 3, 2),
                                                                           ("worker-2", "worker-2", 1, 4)]
    assert [resolve_nproc(auto, n, None) for n in inventory.nodes] == [3, 1]
    assert [resolve_nproc(fixed, n, None) for n in inventory.nodes] == [2, 2]


def test_a_hostfile_inventory_written_back_as_yaml_keeps_its_slots(tmp_path: Path) -> None:
    """The fault-tolerance lighthouse writes its hosts out as a YAML inventory (run/ft/lighthouse.py)."""
    from orchestrator.run.ft.lighthouse import inventory_text
    from orchestrator.spec import inventory_from_text

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=3\n")
    again = inventory_from_text(inventory_text(load_inventory(hostfile).nodes), "again.yaml")
    assert [(n.name, n.slots) for n in again.nodes] == [("worker-1", 3)]
