"""A Slurm job's task on one node: starts the supervisor and writes its stream to the job directory.

`srun` runs this once per node of the allocation. argv: NODE_CONFIG -- TORCHRUN_ARGV...
Before that the batch script asks node 0 of the allocation, the master, for the rendezvous:
argv `port FROM` prints `NODE PORT`, the node's Slurm name and the first free port from FROM;
`port N exact` prints `NODE N` when N is free, else exits 3.

NODE_CONFIG is a JSON file the controller wrote into the job directory, which every node sees
(a shared filesystem): supervisor (remote/config.py, less what each node fills in), stream_dir,
secrets_on_stdin (the job's secret variables come as one JSON line on stdin: the batch script
gives srun the secrets file, which it removed from the filesystem, as stdin), expand:
names of variables that this node fills into the torchrun arguments (`$SLURM_NODEID` differs
per node, so the batch shell cannot), and expand_at: the positions of the arguments it fills
them into (torchrun's own options). Nothing else is expanded: the job's arguments stay literal.

The supervisor's output (batches of the ranks' lines and `\\x1e{json}` events, remote/stream.py) is appended to
STREAM_DIR/<node>.stream, which the controller follows. Slurm owns the job's lifetime, so the
supervisor watches no controller heartbeat; scancel and `srun --kill-on-bad-exit` reach it
as SIGTERM. The task exits with torchrun's status, so that a failed node ends the step.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from dataclasses import replace
from typing import Any, BinaryIO

from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.private import open_private
from orchestrator.remote.probe import first_free_port, port_free
from orchestrator.remote.stream import StreamWriter
from orchestrator.remote.supervisor import start


def expand(argv: list[str], names: list[str], env: dict[str, str], at: list[int]) -> list[str]:
    """Replace `$NAME` for the given names, from `env`, in the arguments at positions `at` only."""
    if not names:
        return list(argv)
    pattern = re.compile(r"\$(" + "|".join(re.escape(n) for n in names) + r")\b")
    return [pattern.sub(lambda m: env.get(m.group(1), m.group(0)), arg) if i in at else arg
            for i, arg in enumerate(argv)]


def read_secrets(cfg: dict[str, Any], stdin: BinaryIO) -> dict[str, str]:
    """The job's secret variables, from the line srun gives this task on stdin; {} when it has none."""
    return json.loads(stdin.readline()) if cfg.get("secrets_on_stdin") else {}


def fill_supervisor_config(cfg: dict[str, Any], node: str, argv: list[str], env: dict[str, str],
                           secrets: dict[str, str]) -> SupervisorConfig:
    """The supervisor's configuration for this node: the job's, with this node's own values."""
    argv = expand(argv, cfg.get("expand", []), env, cfg.get("expand_at", []))
    return replace(SupervisorConfig.from_dict(cfg["supervisor"]), node=node, argv=argv, env=secrets,
                   secret_names=sorted(secrets), first_rank=first_rank(argv))


def first_rank(argv: list[str]) -> int:
    """This node's first global rank: its node rank times the processes per node (a Slurm job's
    nodes all run the same number), read from torchrun's arguments; 0 when they do not say."""
    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else ""

    node_rank, nproc = value("--node-rank"), value("--nproc-per-node")
    return int(node_rank) * int(nproc) if node_rank.isdigit() and nproc.isdigit() else 0


def exit_status(rc: int | None) -> int:
    """A shell-style exit status for torchrun's return code (a signal N becomes 128 + N)."""
    if rc is None:
        return 127
    return 128 - rc if rc < 0 else rc


def choose_port(argv: list[str]) -> int:
    """`port FROM`: this node and the first free port from FROM; `port N exact`: N when it is free."""
    start = int(argv[1])
    if argv[2:] == ["exact"]:
        port = start if port_free(start) else None
        what = f"rendezvous port {start} is in use"
    else:
        port = first_free_port(start)
        what = f"no free TCP port from {start}"
    node = node_name()
    if port is None:
        sys.stderr.write(f"distrun: {what} on {node}\n")
        return 3
    sys.stdout.write(f"{node} {port}\n")
    return 0


def node_name() -> str:
    """This node's name in Slurm (what the other nodes resolve), else its hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def main(argv: list[str]) -> None:
    if argv[0] == "port":
        sys.exit(choose_port(argv))
    config_path, command = argv[0], argv[2:]
    with open(config_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    node = node_name()
    env = dict(os.environ)
    stream_path = os.path.join(cfg["stream_dir"], f"{node}.stream")
    with open_private(stream_path, "ab") as stream:
        # sys.stdin is the bundle file the bootstrap read from; srun's stdin is the process's own.
        config = fill_supervisor_config(cfg, node, command, env, read_secrets(cfg, sys.__stdin__.buffer))
        supervisor = start(config, StreamWriter(stream))
        if supervisor is not None:
            supervisor.run(sys.stdin.buffer)
    if supervisor is None:
        os._exit(2)  # refused: an unsafe directory of the job's on this node
    rc = supervisor.child.returncode if supervisor.child is not None else None
    # The supervisor's threads may still sit in blocking calls; leave without joining them.
    os._exit(exit_status(rc))
