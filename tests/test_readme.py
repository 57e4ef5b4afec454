"""The examples of README.md and docs/: the command headings match `--help`, and every block marked
`sh` runs as printed, in order, on a 3-host namespace lab (the /tmp/ paths are this test's temporary
directory). The README's tour runs first, then docs/commands.md goes on from it on the same lab; every
other docs page with examples runs on its own. A block marked `console` is shown, not run here.

The tests read the files themselves, so they follow whatever the pages say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from orchestrator.cli.main import cli
from tests.cluster.harness import Cluster
from tests.helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
COMMANDS = DOCS / "commands.md"
TOUR = "A five-minute tour on the lab"
QUICK_START = "Install on a controller"  # its block that starts with `distrun examples`: tests/test_wheel_cluster.py
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)
SYNOPSIS = re.compile(r"`distrun (\w+)([^`]*)`")
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
NOT_IN_HEADINGS = {"help", "color"}  # every command has them; the page says so once
LINE_TIMEOUT = 300


def section(title: str, path: Path = README) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def examples(text: str) -> list[str]:
    """Every line of a text's `sh` blocks, in order."""
    return [line.strip() for kind, body in FENCE.findall(text) if kind == "sh"
            for line in body.splitlines() if line.strip()]


def page_examples(path: Path) -> list[str]:
    return examples(path.read_text(encoding="utf-8"))


def pages_with_examples() -> list[Path]:
    """The docs pages that run on their own (docs/commands.md runs after the README's tour)."""
    return [page for page in sorted(DOCS.glob("*.md")) if page != COMMANDS and page_examples(page)]


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
        assert " --grep " not in line or result.stdout.strip(), f"{line}: no line matched"
    return env


def records(env: dict[str, str], *flags: str) -> list[dict]:
    done = subprocess.run(["distrun", "ps", "--json", *flags], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def synopses() -> dict[str, set[str]]:
    """Command name -> the options its heading on docs/commands.md shows."""
    found: dict[str, set[str]] = {}
    for heading in (line for line in COMMANDS.read_text(encoding="utf-8").splitlines() if line.startswith("## `")):
        for name, rest in SYNOPSIS.findall(heading):
            found[name] = set(OPTION.findall(rest))
    return found


def the_survived_job_lost_node1_and_ended_on_the_spare(env: dict[str, str]) -> None:
    """The example's job lost node1 (the page cuts its link), and attempt 2 ran on node0 and the
    spare node2 from the job's own checkpoint; run again as printed, the next job does the same
    from its own directory (one per job: `{job_id}`), not from the first job's last checkpoint."""
    home = Path(env["DISTRUN_HOME"])
    first = records(env)[0]
    run_examples(page_examples(DOCS / "failures.md"), home.parent)
    second = records(env)[0]

    for record in (first, second):
        assert record["state"] == "succeeded" and record["hosts"] == ["node0", "node2"], record
        assert record["quarantined"] == ["node1"] and len(record["attempts"]) == 2, record
        assert record["command"][record["command"].index("--nodes") + 1] == "node[0,2]"  # again: without node1
        began = subprocess.run(["distrun", "logs", record["id"], "--attempt", "1", "--grep", "step 0"], env=env,
                               capture_output=True, text=True, check=True).stdout
        assert f"no checkpoint in /tmp/distrun-ckpt/{record['id']}; starting from step 0" in began, began
    assert first["id"] != second["id"]


AFTER: dict[str, Callable[[dict[str, str]], None]] = {"failures.md": the_survived_job_lost_node1_and_ended_on_the_spare}


def test_the_command_headings_name_every_command_and_exactly_its_options() -> None:
    shown = synopses()

    assert set(shown) == set(cli.commands)
    for name, command in cli.commands.items():
        options = [p for p in command.params
                   if isinstance(p, click.Option) and not p.hidden and p.name not in NOT_IN_HEADINGS]
        missing = [p.opts for p in options if not set(p.opts) & shown[name]]
        unknown = shown[name] - {opt for p in options for opt in p.opts}
        assert (missing, unknown) == ([], set()), name


def test_the_readmes_sh_blocks_are_its_tour_and_its_quick_start() -> None:
    text = README.read_text(encoding="utf-8")
    tour, quick_start = examples(section(TOUR)), examples(section(QUICK_START))

    assert tour and quick_start[0] == "distrun examples"
    assert examples(text) == quick_start + tour


def test_the_survive_example_shows_lines_of_the_job_file_its_commands_launch() -> None:
    shown = next(body for kind, body in FENCE.findall(section("Surviving failures", DOCS / "failures.md"))
                 if kind == "yaml").splitlines()
    job_file = shown[0].removeprefix("# ").split(":")[0]
    assert set(shown[1:]) <= set((REPO / job_file).read_text(encoding="utf-8").splitlines()), job_file

    lines = page_examples(DOCS / "failures.md")
    assert lines and all(job_file in line for line in lines if line.startswith("distrun launch"))


def test_the_readme_tour_then_the_commands_page_run_in_order_on_the_lab(cluster3: Cluster, tmp_path: Path) -> None:
    cluster3.write_inventory(tmp_path / "lab.yaml")
    lines = examples(section(TOUR)) + page_examples(COMMANDS)
    assert len(lines) >= 20 and any("--hosts 1,2,3" in line for line in lines)

    env = run_examples(lines, tmp_path)

    jobs = records(env, "--all")
    assert jobs and all(job["state"] not in ("pending", "running") for job in jobs)
    assert (tmp_path / "report.html").exists()
    assert (tmp_path / "scaling.html").exists() and "Scaling across hosts" in (tmp_path / "scaling.html").read_text()


@pytest.mark.parametrize("page", pages_with_examples(), ids=lambda page: page.name)
def test_each_other_docs_page_runs_its_examples_in_order_on_the_lab(page: Path, cluster3: Cluster,
                                                                     tmp_path: Path) -> None:
    cluster3.write_inventory(tmp_path / "lab.yaml")

    env = run_examples(page_examples(page), tmp_path)

    AFTER.get(page.name, lambda env: None)(env)


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands_and_links_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")

    assert len(text.splitlines()) <= 250
    assert re.findall(r"^## (.+)$", text, re.M)[0] == "Two commands"
    assert "make demo" in section("Two commands") and "45 minutes" in section("Two commands")
    assert {f"docs/{page.name}" for page in DOCS.glob("*.md")} <= set(re.findall(r"\]\((docs/[\w-]+\.md)\)", text))
