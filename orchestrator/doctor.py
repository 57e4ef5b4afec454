"""Checks built from probe facts; `launch_preflight` is the fast subset run before a launch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import DistrunError, ExitCode

if TYPE_CHECKING:
    from orchestrator.launch import Prepared

CONSISTENT_FACTS = ("python", "torch")


class PreflightError(DistrunError):
    """A check failed before anything started: exit 1, nothing was launched."""

    exit_code = ExitCode.FAILED


def mismatches(facts: dict[str, dict[str, Any]], key: str) -> dict[str, list[str]]:
    """Hosts grouped by their value of `key` when the hosts do not all agree, else {}."""
    groups: dict[str, list[str]] = {}
    for node, host_facts in facts.items():
        groups.setdefault(str(host_facts.get(key)), []).append(node)
    return groups if len(groups) > 1 else {}


def launch_preflight(prepared: Prepared) -> None:
    """Refuse to start when the hosts' python or torch versions differ.

    Raises:
        PreflightError: naming each value and the hosts that have it.
    """
    for key in CONSISTENT_FACTS:
        groups = mismatches(prepared.facts, key)
        if groups:
            values = "; ".join(f"{', '.join(nodes)}: {key} {value}" for value, nodes in groups.items())
            raise PreflightError(
                f"preflight: {key} differs between hosts ({values}) "
                f"(install the same {key} everywhere, or --skip-preflight to start anyway)"
            )
