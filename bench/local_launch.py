"""`distrun launch` vs plain `torchrun` on the same trivial job on this machine.

Alternating runs, launch-to-exit wall time, medians and the ratio, written to
bench/results/local-launch.md. Goal: distrun adds at most 5 % or 0.3 s, whichever is larger.

    .venv/bin/python bench/local_launch.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from common import REPO, alternate, median, timed, write_results

JOB = REPO / "bench" / "allreduce_job.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="distrun-bench-"))
    job = tmp / "job.yaml"
    job.write_text(f"name: bench\nscript: {JOB}\nnproc_per_node: 2\nenv: {{OMP_NUM_THREADS: '1'}}\n"
                   "telemetry: {enabled: false}\n")
    env = {"DISTRUN_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1"}
    distrun = [sys.executable, "-m", "orchestrator", "launch", str(job)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", "29533", str(JOB)]
    # What distrun runs: each rank's output to files of its own, which its supervisor reads.
    redirected = [*torchrun[:-1], "--redirects", "3", "--log-dir", str(tmp / "torchrun-logs"), str(JOB)]
    times = alternate({"torchrun": lambda: timed(torchrun, env),
                       "torchrun --redirects 3": lambda: timed(redirected, env),
                       "distrun": lambda: timed(distrun, env)}, args.rounds)
    base, teed, ours = (median(times[k]) for k in ("torchrun", "torchrun --redirects 3", "distrun"))
    allowed = max(base * 0.05, 0.3)
    body = [
        f"{args.rounds} alternating rounds; 2 gloo processes, one all-reduce; launch to exit.", "",
        "| launcher | median s | runs (s) |", "|---|---|---|",
        *[f"| {name} | {median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |" for name, v in times.items()],
        "", f"Ratio distrun / plain torchrun: **{ours / base:.3f}**; added {ours - base:+.2f} s "
        f"(budget: {allowed:.2f} s = max(5 %, 0.3 s)) -> {'met' if ours - base <= allowed else 'NOT met'}.",
        f"Of that, torchrun's own `--redirects 3 --log-dir` (which distrun runs: each rank's lines to "
        f"files of its own) costs "
        f"{teed - base:+.2f} s; distrun's own part (CLI, probe, plan, supervisor, records) is "
        f"{ours - teed:+.2f} s.",
    ]
    print(write_results("local-launch.md", "distrun launch vs torchrun, local", "python bench/local_launch.py", body)
          .read_text())


if __name__ == "__main__":
    main()
