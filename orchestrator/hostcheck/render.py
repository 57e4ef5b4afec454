"""Doctor's output: the table people read, and the `--json` document.

JSON output (`--json`), schema version 1:

    {
      "schema": 1,
      "seconds": 1.42,                      # wall time of the whole run
      "master": {"node": "node0", "addr": "10.0.0.10" | null, "port": 29500 | null},
      "hosts": {                            # every selected host, in inventory order
        "node0": {
          "reachable": true,                # false: SSH connection or authentication failed
          "error": null | "why the host was not reached or its probe failed",
          "facts": null | {...}             # the probe's facts (orchestrator/facts.py)
        }
      },
      "checks": [                           # in the order of the table
        {"name": "torch", "status": "ok" | "warn" | "error" | "skip",   # skip: could not run
         "hosts": ["node2"],                # the hosts the status concerns (all, when ok)
         "detail": "torch differs: node[0-1]: 2.13.0; node2: 2.0.0",
         "hint": "one-line fix; empty when ok"}
      ],
      "bandwidth": null | {                 # with --bandwidth
        "backend": "gloo" | "nccl", "nnodes": 3, "world_size": 3, "job_id": "...",
        "min_busbw_gbps": 0.1, "error": null | "why it did not run",
        "results": [{"bytes": 1048576, "time_s": 0.004, "algbw_gbps": 0.26, "busbw_gbps": 0.35}]
      },
      "summary": {"ok": 17, "warn": 1, "error": 0, "skip": 0},
      "exit_code": 0
    }

`facts` are the probe's own keys, as orchestrator/facts.py reads them into `HostFacts`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.hostcheck.checks import Check, Context, Status
from orchestrator.hostcheck.probe import ProbeResult
from orchestrator.remote.redact import escape_controls

SCHEMA = 1
MARKS = {"ok": "✓", "warn": "!", "error": "✗", "skip": "-"}
COLOURS = {"ok": 32, "warn": 33, "error": 31, "skip": 90}


def _paint(text: str, status: Status, colour: bool) -> str:
    return f"\x1b[{COLOURS[status.value]}m{text}\x1b[0m" if colour else text


def render_check(check: Check, width: int, colour: bool = False) -> list[str]:
    """A check's row, and its fix hint under it when it is not ok.

    Details and hints quote what hosts reported (versions, hostnames, errors): their control
    characters are shown as text, so that no host can retitle or clear the operator's terminal.
    """
    detail = escape_controls(check.detail)
    lines = [f"{_paint(MARKS[check.status.value], check.status, colour)} {check.name:<{width}}  {detail}"]
    if check.status is not Status.OK and check.hint:
        lines.append(f"  {'':<{width}}  fix: {escape_controls(check.hint)}")
    return lines


def folded_skips(checks: list[Check]) -> list[Check]:
    """The table's rows: skipped checks in a row that share their reason are one row naming them all
    (a host that could not be reached skips some twenty checks for one reason), and a run of skipped
    rows with one fix says it once, under the last."""
    rows: list[tuple[Check, list[str]]] = []
    for check in checks:
        last = rows[-1][0] if rows else None
        if (last is not None and check.status is Status.SKIP and last.status is Status.SKIP
                and (last.detail, last.hint) == (check.detail, check.hint)):
            rows[-1][1].append(check.name)
        else:
            rows.append((check, [check.name]))
    folded = [replace(check, name=f"{len(names)} checks", detail=f"{check.detail}: {', '.join(names)}")
              if len(names) > 1 else check for check, names in rows]
    said_below = [row.status is Status.SKIP and after.status is Status.SKIP and row.hint == after.hint
                  for row, after in itertools.pairwise(folded)]
    return [replace(row, hint="") if below else row for row, below in zip(folded, [*said_below, False], strict=True)]


def summary(checks: list[Check]) -> dict[str, int]:
    return {s.value: sum(1 for c in checks if c.status is s) for s in Status}


def render_table(checks: list[Check], ctx: Context, seconds: float, colour: bool = False) -> str:
    """The report people read: a header, one row per check, a summary line."""
    hosts = fold_hosts([n.name for n in ctx.nodes])
    where = f"{ctx.master_addr}" if ctx.master_addr else "address unknown"
    lines = [f"distrun doctor: {len(ctx.nodes)} host(s) {hosts}, master {ctx.master} ({where})", ""]
    rows = folded_skips(checks)
    width = max(len(c.name) for c in rows)
    for check in rows:
        lines += render_check(check, width, colour)
    counts = summary(checks)
    skips = f", {counts['skip']} skipped" if counts["skip"] else ""
    tally = f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['error']} error(s){skips}"
    lines += ["", f"{tally} in {seconds:.1f} s"]
    return "\n".join(lines)


def to_json(results: Mapping[str, ProbeResult], checks: list[Check], ctx: Context, seconds: float,
            code: int, bandwidth: dict[str, Any] | None) -> dict[str, Any]:
    """The `--json` document (schema in this module's docstring)."""
    master = results.get(ctx.master)
    listen = master.facts.listen if master is not None and master.facts is not None else None
    return {
        "schema": SCHEMA,
        "seconds": round(seconds, 3),
        "master": {"node": ctx.master, "addr": ctx.master_addr, "port": listen.port if listen else None},
        "hosts": {name: {"reachable": not r.unreachable, "error": r.error, "facts": r.facts.raw if r.facts else None}
                  for name, r in results.items()},
        "checks": [c.to_dict() for c in checks],
        "bandwidth": bandwidth,
        "summary": summary(checks),
        "exit_code": code,
    }


