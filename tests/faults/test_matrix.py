"""The fault matrix on the namespace cluster: every cell of matrix.CELLS, judged by invariants.check.

One 3-host cluster serves every cell (each leaves its hosts clean, or fails saying what it
left). Another job runs on the same hosts through every cell that must leave it untouched
(`Bystander`); it must then end well. The cells that take a whole host down run after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.faults import invariants
from tests.faults.matrix import CELLS, Cell, Phase, render_table
from tests.faults.scene import Bystander, Scene

README = Path(__file__).parent / "README.md"
WITH_OTHER_JOB = [cell for cell in CELLS if cell.bystander]
TAKING_A_HOST_DOWN = [cell for cell in CELLS if not cell.bystander]


def _params(cells: list[Cell]) -> list[object]:
    return [pytest.param(cell, id=cell.id) for cell in cells]


@pytest.fixture(scope="module")
def bystander(cluster3: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bystander]:
    other = Bystander(cluster3, tmp_path_factory.mktemp("bystander"))
    try:
        yield other
    finally:
        other.finish()


def run_cell(cell: Cell, cluster: Cluster, bystander: Bystander | None, tmp_path: Path) -> None:
    """Drive the cell's job to its phase, inject the fault, watch, and judge."""
    if cell.phase is Phase.FT:
        pytest.importorskip("torchft")
    scene = Scene(cluster, cell, tmp_path, bystander)
    seen = scene.run()
    problems = invariants.check(cell, seen, scene.job_id)
    print(f"{cell.id}: controller back after {seen.returned} s, hosts clean after {seen.clean} s")
    assert not problems, f"{cell.id}:\n" + "\n".join(problems)


@pytest.mark.parametrize("cell", _params(WITH_OTHER_JOB))
def test_a_fault_keeps_every_invariant_and_leaves_the_other_job_untouched(cell: Cell, cluster3: Cluster,
                                                                          bystander: Bystander, tmp_path: Path) -> None:
    bystander.ensure()
    run_cell(cell, cluster3, bystander, tmp_path)


def test_the_other_job_ends_well_after_every_fault_it_lived_through(bystander: Bystander) -> None:
    if bystander.controller is None:
        pytest.skip("no cell with another job ran")
    rc, record = bystander.finish()
    assert (rc, record and record["state"]) == (0, "succeeded"), bystander.controller.terminal()[-2000:]


@pytest.mark.parametrize("cell", _params(TAKING_A_HOST_DOWN))
def test_a_fault_that_takes_a_host_down_keeps_every_invariant(cell: Cell, cluster3: Cluster, tmp_path: Path) -> None:
    run_cell(cell, cluster3, None, tmp_path)


def test_readme_table_is_the_matrix() -> None:
    text = README.read_text()
    start = text.index("| fault | phase |")
    end = text.index("\n\n", start)
    assert text[start:end + 1] == render_table(), "tests/faults/README.md's table differs from matrix.CELLS"
