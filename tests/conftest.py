"""Project-wide pytest setup: the `cluster` marker and why cluster tests were skipped."""

from __future__ import annotations

from collections import Counter

import pytest

# The real multi-host clusters, shared by every test module (and the hook that skips them
# where no cluster can be built): imported to register them here.
from tests.cluster.fixtures import (  # noqa: F401
    _stale_cleaned,
    cluster3,
    make_cluster,
    pytest_collection_modifyitems,
    pytest_runtest_setup,
    slurm_cluster,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: real multi-host test on namespace hosts (root, ip netns, sshd)")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = Counter(_skip_reason(report) for report in skipped if "cluster" in getattr(report, "keywords", {}))
    for reason, count in reasons.items():
        terminalreporter.write_line(f"{count} cluster tests skipped: {reason}")
