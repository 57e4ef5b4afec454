"""A launch's record, written from what its backend's hooks return (backends/base.py): the job
saved as pending once submitted, its hosts once placed, what the backend learnt on the way, and
how it ended before it started. The backend never writes the record itself."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, TextIO

from orchestrator.backends.base import LaunchContext, Learnt, Settled, Submitted
from orchestrator.console import terminal
from orchestrator.liveness import process_start
from orchestrator.plan import LaunchPlan
from orchestrator.run.request import LaunchRequest
from orchestrator.spec.model import JobSpec
from orchestrator.store import JobRecord, JobState, Store


@dataclass
class Launching:
    """One launch as the run loop holds it: what was asked, where it is recorded, and the context
    its backend's hooks see (`ctx`, whose `learn` is recorded here)."""

    request: LaunchRequest
    store: Store
    ctx: LaunchContext = field(init=False)

    @classmethod
    def of(cls, request: LaunchRequest, job: JobSpec, job_id: str, store: Store,
           stream: TextIO | None) -> Launching:
        """The launch of `job` as `job_id`, its lines shown on `stream` (None: nowhere)."""
        made = cls(request, store)
        made.ctx = LaunchContext(job, job_id, request.asked(), store.job_dir(job_id), made.learnt, stream)
        return made

    @property
    def job_id(self) -> str:
        return self.ctx.job_id

    def colour(self) -> bool:
        """Whether lines may be coloured: --color, the config file, NO_COLOR, else a terminal that is a tty."""
        return self.ctx.terminal is not None and terminal.colour(self.ctx.terminal)

    def command(self, plan: LaunchPlan, hosts: list[str]) -> dict[str, Any]:
        """The record's `command` field for a job on `hosts` ({} for a run distrun makes for itself)."""
        if self.request.internal:
            return {}
        return {"command": self.request.reproduce(hosts, plan.inventory_path, plan.spares)}

    def submitted(self, plan: LaunchPlan, submitted: Submitted) -> None:
        """Record the job as pending, from its plan; without hosts and master while a scheduler places it."""
        hosts = [h.node for h in plan.hosts] if submitted.placed else []
        master = plan.master_addr if submitted.placed else ""
        self.store.save(JobRecord(
            id=plan.job_id, name=plan.job_name, spec_path=plan.spec_path, inventory=plan.inventory_path,
            backend=plan.backend, state=JobState.PENDING, controller_pid=os.getpid(),
            controller_start=process_start(os.getpid()), backend_ref=submitted.backend_ref,
            internal=self.request.internal, hosts=hosts, master_addr=master, master_port=plan.master_port,
            **self.command(plan, hosts)))

    def placed(self, plan: LaunchPlan) -> None:
        """Record the hosts a scheduler chose (the pending reason goes)."""
        self.store.update(self.job_id, hosts=[h.node for h in plan.hosts], master_addr=plan.master_addr, detail="")

    def learnt(self, learnt: Learnt) -> None:
        """Record what the backend learnt (`ctx.learn`): the fields it set."""
        fields = {"backend_ref": learnt.backend_ref, "detail": learnt.pending, "master_addr": learnt.master_addr,
                  "master_port": learnt.master_port}
        self.store.update(self.job_id, **{key: value for key, value in fields.items() if value is not None})

    def ended(self, settled: Settled) -> int:
        """Record how the job ended before it started; the launch's exit code."""
        code = int(settled.exit_code or 0)
        self.store.end(self.job_id, settled.state, code, settled.detail)
        return code
