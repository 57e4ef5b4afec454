"""`distrun doctor` and the launch's preflight, in layers.

    probe.py       driving the shipped probe on many hosts at once (a probe round)
    checks.py      pure checks from typed host facts (orchestrator/facts.py) to report rows
    render.py      the table and the `--json` document
    bandwidth_check.py  the all-reduce job's check and table (apart: the preflight never imports the job)
    command.py     the command: select, probe, check, render, exit status
    preflight.py   the few checks a launch runs on the facts of its own probe round
"""

from orchestrator.doctor.command import DoctorRequest, run_doctor
from orchestrator.doctor.preflight import PreflightError, launch_preflight

__all__ = ["DoctorRequest", "PreflightError", "launch_preflight", "run_doctor"]
