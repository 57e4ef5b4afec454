"""YAML loading and validation of the two file formats: inventory and job."""

from orchestrator.spec.inventory import default_inventory, inventory_from_text, load_inventory, resolve_inventory_path
from orchestrator.spec.job import job_from_text, load_job
from orchestrator.spec.model import (
    HostKeyPolicy,
    Inventory,
    JobSpec,
    NodeSpec,
    Rendezvous,
    Select,
    Telemetry,
    TransportKind,
)
from orchestrator.spec.select import HostSelection, SelectionGuard, select_hosts, select_nodes, select_with_spares

__all__ = [
    "HostKeyPolicy",
    "HostSelection",
    "Inventory",
    "JobSpec",
    "NodeSpec",
    "Rendezvous",
    "Select",
    "SelectionGuard",
    "Telemetry",
    "TransportKind",
    "default_inventory",
    "inventory_from_text",
    "job_from_text",
    "load_inventory",
    "load_job",
    "resolve_inventory_path",
    "select_hosts",
    "select_nodes",
    "select_with_spares",
]
