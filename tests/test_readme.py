"""The README's Commands section: its headings match `--help`, and its examples run, in the order
printed, on a 3-host namespace lab (the README's /tmp/ paths are this test's temporary directory).

The test reads the README itself, so it follows whatever the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click

from orchestrator.cli import cli
from tests.cluster.harness import Cluster
from tests.helpers import REPO

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SYNOPSIS = re.compile(r"`distrun (\w+)([^`]*)`")
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
NOT_IN_HEADINGS = {"help", "color"}  # every command has them; the section says so once
LINE_TIMEOUT = 300


def commands_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Commands\n")
    return text[start:text.index("\n## ", start + 1)]


def examples() -> list[str]:
    """Every line of the section's ```sh blocks, in order."""
    return [line for kind, body in FENCE.findall(commands_section()) if kind == "sh"
            for line in body.splitlines() if line.strip()]


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
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DISTRUN_HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config"), "OMP_NUM_THREADS": "1"}
    env.pop("DISTRUN_INVENTORY", None)
    lines = examples()
    assert len(lines) >= 20 and any("--hosts 1,2,3" in line for line in lines)

    for line in lines:
        command = line.replace("/tmp/", f"{tmp_path}/")
        result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=LINE_TIMEOUT, check=False)
        assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, line

    jobs = json.loads(subprocess.run(["distrun", "ps", "--all", "--json"], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    assert jobs and all(job["state"] not in ("pending", "running") for job in jobs)
    assert (tmp_path / "scaling.html").exists() and "Scaling across hosts" in (tmp_path / "scaling.html").read_text()
