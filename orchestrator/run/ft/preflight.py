"""The fault-tolerant job's own preflight: torchft imports in the python of every host (and of
every spare) that may run a replica group; the groups' launches check the rest."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.console.display import fold_hosts
from orchestrator.fanout.group import Group
from orchestrator.hostcheck.preflight import PreflightError
from orchestrator.spec import NodeSpec
from orchestrator.transport import CommandResult, Transport

# torchft imports, and the directories the lighthouse's PATH needs, as one PATH prefix: first the
# one that has `torchft_lighthouse` of the scripts directory of the python that runs (an inventory's
# python may be a wrapper around the one pip installed torchft into), the python's own, the `bin`
# beside torchft's package (`pip install --target DIR` puts it in DIR/bin) and the host's PATH;
# then the scripts directory and the python's own, so that a python named by a bare name (`python3`)
# is the same one under that PATH.
PROBE = ("import os, shutil, sys, sysconfig, torchft; "
         "own = [sysconfig.get_path('scripts'), os.path.dirname(sys.executable)]; "
         "dirs = [*own, os.path.join(os.path.dirname(os.path.dirname(torchft.__file__)), 'bin'), "
         "os.path.dirname(shutil.which('torchft_lighthouse') or '')]; "
         "found = [d for d in dirs if d and os.access(os.path.join(d, 'torchft_lighthouse'), os.X_OK)]; "
         "print(os.pathsep.join(dict.fromkeys([*found[:1], *own])))")
PROBE_TIMEOUT = 120.0  # torchft imports torch: seconds on a cold or busy host


def _imports(transport: Transport) -> CommandResult:
    return transport.run([transport.node.python, "-c", PROBE], timeout=PROBE_TIMEOUT)


def check_torchft(nodes: Sequence[NodeSpec]) -> dict[str, str]:
    """Refuse the launch when torchft does not import on a host (one line naming every such host);
    a host that cannot be reached is left to its group's own preflight.

    Returns:
        Each host's PATH prefix for the lighthouse (PROBE), from the hosts that answered.

    Raises:
        PreflightError: torchft is missing on at least one host.
    """
    with Group(nodes) as group:
        results = group.run(_imports)
    missing = sorted(node for node, result in results.succeeded.items() if result.returncode != 0)
    if missing:
        last = (results.succeeded[missing[0]].stderr.strip().splitlines() or ["no output"])[-1]
        raise PreflightError(f"preflight failed; nothing was started (--skip-preflight starts anyway): torchft does "
                             f"not import in the python of {fold_hosts(missing)} ({last}); install it there "
                             f"(pip install torchft==0.2.0) or name another python in the inventory")
    return {node: lines[-1] for node, result in results.succeeded.items() if (lines := result.stdout.split())}
