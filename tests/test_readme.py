"""The README's Commands and "Surviving failures" sections: the headings match `--help`, and the
examples run, in the order printed, on a 3-host namespace lab (the README's /tmp/ paths are this
test's temporary directory).

The test reads the README itself, so it follows whatever the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click

from orchestrator.cli.main import cli
from tests.cluster.harness import Cluster
from tests.helpers import REPO

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SYNOPSIS = re.compile(r"`distrun (\w+)([^`]*)`")
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
NOT_IN_HEADINGS = {"help", "color"}  # every command has them; the section says so once
LINE_TIMEOUT = 300


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def commands_section() -> str:
    return section("Commands")


def examples(title: str = "Commands") -> list[str]:
    """Every line of a section's ```sh blocks, in order."""
    return [line for kind, body in FENCE.findall(section(title)) if kind == "sh"
            for line in body.splitlines() if line.strip()]


def run_examples(lines: list[str], tmp_path: Path) -> dict[str, str]:
    """Run each line as printed (its /tmp/ paths in tmp_path), each expected to succeed; returns the env."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DISTRUN_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "OMP_NUM_THREADS": "1"}
    env.pop("DISTRUN_INVENTORY", None)
    for line in lines:
        command = line.replace("/tmp/", f"{tmp_path}/")
        result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=LINE_TIMEOUT, check=False)
        assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, line
    return env


def synopses() -> dict[str, set[str]]:
    """Command name -> the options its heading shows."""
    found: dict[str, set[str]] = {}
    for heading in (line for line in commands_section().splitlines() if line.startswith("### ")):
        for name, rest in SYNOPSIS.findall(heading):
            found[name] = set(OPTION.findall(rest))
    return found


def test_the_command_headings_name_every_command_and_exactly_its_options() -> None:
    shown = synopses()

    assert set(shown) == set(cli.commands)
    for name, command in cli.commands.items():
        options = [p for p in command.params
                   if isinstance(p, click.Option) and not p.hidden and p.name not in NOT_IN_HEADINGS]
        missing = [p.opts for p in options if not set(p.opts) & shown[name]]
        unknown = shown[name] - {opt for p in options for opt in p.opts}
        assert (missing, unknown) == ([], set()), name


def test_the_examples_run_in_order_on_the_lab(cluster3: Cluster, tmp_path: Path) -> None:
    cluster3.write_inventory(tmp_path / "lab.yaml")
    lines = examples()
    assert len(lines) >= 20 and any("--hosts 1,2,3" in line for line in lines)

    env = run_examples(lines, tmp_path)

    jobs = json.loads(subprocess.run(["distrun", "ps", "--all", "--json"], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    assert jobs and all(job["state"] not in ("pending", "running") for job in jobs)
    assert (tmp_path / "scaling.html").exists() and "Scaling across hosts" in (tmp_path / "scaling.html").read_text()


def test_the_surviving_failures_example_is_the_job_file_it_names_and_runs_as_printed(cluster3: Cluster,
                                                                                    tmp_path: Path) -> None:
    cluster3.write_inventory(tmp_path / "lab.yaml")
    text = section("Surviving failures")
    shown = next(body for kind, body in FENCE.findall(text) if kind == "yaml").splitlines()
    job_file = shown[0].removeprefix("# ").split(":")[0]
    assert set(shown[1:]) <= set((REPO / job_file).read_text(encoding="utf-8").splitlines()), job_file
    lines = examples("Surviving failures")
    assert lines and all(job_file in line for line in lines if line.startswith("distrun launch"))

    env = run_examples(lines, tmp_path)

    record = json.loads(subprocess.run(["distrun", "ps", "--json"], env=env, capture_output=True, text=True,
                                       check=True).stdout)[0]
    assert record["state"] == "succeeded" and record["hosts"] == ["node0", "node1"], record
    assert record["command"][record["command"].index("--nodes") + 1:][:3] == ["node[0-2]", "--nnodes", "2"]
