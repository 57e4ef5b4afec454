"""How often the supervisor's relay wakes while a job is quiet, and how soon it sees torchrun exit.

On a host the ranks share with it, every wake-up of the relay costs them CPU: a quiet job's
relay wakes ten times a second after its first quiet second, and its longer pauses end at once
when torchrun exits (bench/results/launch.md, "Fixed cost of a launch").
"""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.remote import relay as relay_module
from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.relay import Relay
from orchestrator.remote.stream import StreamWriter


def quiet_relay(tmp_path: Path) -> Relay:
    cfg = SupervisorConfig(job_id="quiet-1", node="n0")
    return Relay(cfg, StreamWriter(io.BytesIO()), str(tmp_path / "job"), lambda _text: None)


def test_a_quiet_jobs_relay_wakes_ten_times_a_second_after_its_first_quiet_second(tmp_path: Path) -> None:
    relay = quiet_relay(tmp_path)
    sweeps = 0
    sweep = relay.tailer.sweep

    def counted(rescan: bool = False) -> bool:
        nonlocal sweeps
        sweeps += 1
        return sweep(rescan)

    relay.tailer.sweep = counted  # type: ignore[method-assign]
    relay.run(subprocess.Popen(["sleep", "3"]))

    # 1 s at fifty a second, then 2 s at ten: about 70 (at fifty a second throughout: 150).
    assert 20 <= sweeps <= 100


def test_the_relay_sees_torchrun_exit_at_once_even_in_a_long_quiet_pause(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "QUIET_AFTER", 0.0)
    monkeypatch.setattr(relay_module, "TAIL_QUIET", 30.0)
    relay = quiet_relay(tmp_path)
    began = time.monotonic()

    relay.run(subprocess.Popen(["sleep", "0.5"]))

    assert time.monotonic() - began < 10
