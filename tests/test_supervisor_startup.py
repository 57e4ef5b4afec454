"""What a host's supervisor costs before torchrun starts: every launch pays it once per host,
on the CPU the ranks then share (bench/results/launch.md, "Fixed cost of a launch")."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_MODULES

RUN_MAIN = "sys.modules[b['main']].main(sys.argv[2:])\n"


def modules_after_bootstrap(modules: list[str]) -> set[str]:
    """The modules a python holds once the bootstrap installed the supervisor's bundle (its main not run)."""
    assert RUN_MAIN in remote.BOOTSTRAP
    payload = remote.bundle("supervisor", modules)
    argv = remote.bootstrap_argv(sys.executable, payload, "startup-test")
    argv[2] = remote.BOOTSTRAP.replace(RUN_MAIN, "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run(argv, input=payload, capture_output=True, check=True).stdout
    return set(json.loads(out))


def test_the_supervisor_starts_without_importing_http_client() -> None:
    loaded = modules_after_bootstrap(SUPERVISOR_MODULES)

    assert "orchestrator.remote.supervisor" in loaded
    assert not {"http.client", "ssl", "email.parser"} & loaded
