"""The fault matrix on the namespace cluster: every cell of matrix.CELLS, judged by invariants.check.

One 3-host cluster serves every cell (each leaves its hosts clean, or fails saying what it
left), with another job on the same hosts throughout (`Bystander`). Cells that keep the other
job alive run first, so it is started again only after the cells that take a host down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.faults import invariants
from tests.faults.matrix import CELLS, Cell, render_table
from tests.faults.scene import Bystander, Scene, small_disk

README = Path(__file__).parent / "README.md"
ORDERED = sorted(CELLS, key=lambda cell: not cell.bystander)


def _param(cell: Cell) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=f"waits on {cell.waits_on}")] if cell.waits_on else []
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.fixture(scope="module")
def bystander(cluster3: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bystander]:
    other = Bystander(cluster3, tmp_path_factory.mktemp("bystander"))
    try:
        yield other
    finally:
        rc, record = other.finish()
        assert rc == 0 and record is not None and record["state"] == "succeeded", \
            "the other job on the same hosts did not end well"


@pytest.mark.parametrize("cell", [_param(cell) for cell in ORDERED])
def test_fault_cell_keeps_every_invariant(cell: Cell, cluster3: Cluster, bystander: Bystander,
                                          tmp_path: Path) -> None:
    if cell.bystander:
        bystander.ensure()
    scene = Scene(cluster3, cell, tmp_path, bystander if cell.bystander else None)
    try:
        with small_disk(scene):
            scene.reach()
            scene.inject()
            seen = scene.watch()
    finally:
        scene.close()
    problems = invariants.check(cell, seen, scene.job_id)
    print(f"{cell.id}: controller back after {seen.returned} s, hosts clean after {seen.clean} s")
    assert not problems, f"{cell.id}:\n" + "\n".join(problems)


def test_readme_table_is_the_matrix() -> None:
    text = README.read_text()
    start = text.index("| fault | phase |")
    end = text.index("\n\n", start)
    assert text[start:end + 1] == render_table(), "tests/faults/README.md's table differs from matrix.CELLS"
