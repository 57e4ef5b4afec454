"""A running job's figures for Prometheus: the controller's `/metrics` endpoint and `distrun metrics`.

The figures are what the controller already keeps (the telemetry aggregator's latest samples, the
ranks' latest metrics records, the job's attempts, quarantined hosts and alerts), taken as one
`JobFigures` snapshot per scrape; nothing here runs in the run loop. The exposition format is
prometheus_client's. docs/metrics.md lists every metric.

    figures.py    JobFigures: one job's snapshot, from the live controller or a job directory's files
    families.py   the metric families of some jobs' figures (a prometheus_client Collector)
    endpoint.py   the HTTP endpoint a launch serves while its job runs
"""

from __future__ import annotations

from orchestrator.metrics.endpoint import Endpoint, bind
from orchestrator.metrics.families import JobsCollector, exposition, families_json
from orchestrator.metrics.figures import JobFigures, from_files, hosts_lost

__all__ = ["Endpoint", "JobFigures", "JobsCollector", "bind", "exposition", "families_json", "from_files", "hosts_lost"]
