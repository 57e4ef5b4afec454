"""Fixtures that bring up real multi-host clusters (namespace hosts with sshd).

tests/conftest.py imports them, so every test module shares them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .harness import Cluster, cleanup_stale, skip_reason

requires_cluster = pytest.mark.cluster

MakeCluster = Callable[..., Cluster]

CLUSTER_FIXTURES = frozenset({"cluster3", "make_cluster", "slurm_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that use a cluster fixture at collection, so `-m "not cluster"` deselects them."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(requires_cluster)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip cluster tests where no cluster can be built here."""
    reason = skip_reason()
    if reason is not None and item.get_closest_marker("cluster") is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def _stale_cleaned() -> None:
    """Remove what killed earlier runs of this checkout left, once per session."""
    cleanup_stale()


@pytest.fixture(scope="module")
def cluster3(_stale_cleaned: None) -> Iterator[Cluster]:
    """Three hosts shared by a module's tests; tests must leave them as they found them."""
    with Cluster(3) as cluster:
        yield cluster


@pytest.fixture
def make_cluster(_stale_cleaned: None) -> Iterator[MakeCluster]:
    """`make(n=3, *, private_dirs=False, bastion=False)`: clusters torn down after the test."""
    made: list[Cluster] = []

    def make(n: int = 3, *, private_dirs: bool = False, bastion: bool = False) -> Cluster:
        cluster = Cluster(n, private_dirs=private_dirs, bastion=bastion)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.teardown()


# Slurm on two namespace hosts (munged, slurmctld, a slurmd per host): tests/cluster/slurm.py.
from .slurm import slurm_cluster  # noqa: E402, F401 - registered with the others by tests/conftest.py
