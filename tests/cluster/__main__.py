"""A namespace cluster by hand: `python -m tests.cluster up|down|status` (as root).

up -n 3 [--bastion] [--private-dirs]   bring hosts up, print the inventory, wait for Ctrl-C
down                                   remove every cluster of this checkout, live or not
status                                 list registered clusters
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

from .harness import Cluster, cleanup_stale, skip_reason
from .registry import CHECKOUT, describe, records


def _up(args: argparse.Namespace) -> int:
    try:
        with Cluster(args.n, private_dirs=args.private_dirs, bastion=args.bastion) as cluster:
            inventory = cluster.write_inventory(args.inventory)
            print(f"prefix: {cluster.prefix}")
            print(f"inventory: {inventory}")
            print(f"up in {cluster.bringup_seconds:.2f} s; try: {shlex.join(cluster.ssh_argv(0))} hostname")
            print("Ctrl-C tears the cluster down.", flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt:
        print("torn down", flush=True)
    return 0


def _down(args: argparse.Namespace) -> int:
    removed = cleanup_stale(include_live=args.force)
    print(f"removed {' '.join(removed)}" if removed else "nothing to remove")
    live = [record for record in records() if record.checkout == str(CHECKOUT)]
    for record in live:
        print(f"left alone (creator alive; --force removes it): {describe(record)}")
    return 0


def _status(_args: argparse.Namespace) -> int:
    found = records()
    for record in found:
        print(describe(record))
    if not found:
        print("no test clusters registered")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="bring a cluster up until Ctrl-C")
    up.add_argument("-n", type=int, default=3, help="number of hosts (default 3)")
    up.add_argument("--bastion", action="store_true", help="reach hosts only through a bastion")
    up.add_argument("--private-dirs", action="store_true", help="a private tmpfs on /srv/node per host")
    up.add_argument("--inventory", help="write the cluster's inventory here (default: in its state directory)")
    up.set_defaults(run=_up)
    down = commands.add_parser("down", help="remove this checkout's clusters whose creator died")
    down.add_argument("--force", action="store_true", help="also remove clusters whose creator still runs")
    down.set_defaults(run=_down)
    commands.add_parser("status", help="list registered clusters").set_defaults(run=_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    reason = skip_reason()
    if reason is not None and args.command != "status":
        print(f"cannot build a test cluster here: {reason}", file=sys.stderr)
        return 3
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
