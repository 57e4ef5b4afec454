"""A stand-in for torchrun in fast tests: the same files as `--redirects 3 --log-dir DIR`, no torch.

On PYTHONPATH ahead of the real torch, `python -m torch.distributed.run --nproc-per-node N
--redirects 3 --log-dir DIR SCRIPT ARGS` starts N workers of `python -u SCRIPT ARGS` with
torchrun's environment (RANK, LOCAL_RANK, TORCHELASTIC_RESTART_COUNT, ...), each writing its
stdout and stderr to DIR/<run>_<random>/attempt_0/<local rank>/stdout.log and stderr.log, as
torchrun 2.13 lays them out, says so on its own stderr, and exits with the first failure's code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--redirects", default="0")
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", default="0")
    parser.add_argument("--max-restarts", default="0")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    attempt = os.path.join(tempfile.mkdtemp(prefix="fake_", dir=args.log_dir), "attempt_0")
    workers = []
    for local in range(args.nproc_per_node):
        folder = os.path.join(attempt, str(local))
        os.makedirs(folder)
        env = {**os.environ, "LOCAL_RANK": str(local), "RANK": str(args.node_rank * args.nproc_per_node + local),
               "WORLD_SIZE": str(args.nproc_per_node), "TORCHELASTIC_RESTART_COUNT": "0"}
        with open(os.path.join(folder, "stdout.log"), "w") as out, open(os.path.join(folder, "stderr.log"), "w") as err:
            workers.append(subprocess.Popen([sys.executable, "-u", args.script, *args.args], stdout=out, stderr=err,
                                            env=env, start_new_session=True))
    sys.stderr.write(f"fake torchrun: started {len(workers)} worker(s)\n")
    codes = [worker.wait() for worker in workers]
    failed = [code for code in codes if code]
    if failed:
        sys.stderr.write(f"fake torchrun: a worker failed (exitcode: {failed[0]})\n")
    return abs(failed[0]) if failed else 0


if __name__ == "__main__":
    sys.exit(main())
