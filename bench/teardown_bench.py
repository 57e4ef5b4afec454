"""How often a rank of the compare set's FSDP and DDP jobs aborts at exit, by launcher.

A rank that finished its work can still die at exit with `terminate called without an active
exception` / `Fatal Python error: Aborted` (SIGABRT); bench/results/teardown.md has the cause.
This script counts it. Each round runs every (job, launcher) pair once, in an order rotated
round by round, so load from other work on the machine hits every launcher alike. Launchers:

    torchrun          plain torchrun, worker output inherited (no --tee)
    torchrun-tee      torchrun --tee 3 (how distrun starts ranks today)
    torchrun-redirect torchrun --log-dir DIR --redirects 3 (per-rank files, nothing echoed)
    distrun           distrun launch JOB.yaml

`--where local` runs them on this machine (distrun's built-in local inventory); `--where hosts`
on 3 namespace hosts with real sshd (tests/cluster), where the torchrun launchers go through
pdsh with `--node-rank %n`; `--where both` alternates the two batch by batch. A batch starts no
round after `--minutes`; with `--lock FILE` each batch holds that flock and the script goes on,
batch after batch, until the label has `--rounds` rounds. Every run is one JSON line appended to
bench/results/teardown-runs.jsonl, so batches add up and an interrupted series resumes.
`report` turns a label's lines into a markdown table (abort counts, 95% Wilson intervals,
Fisher's exact test against plain torchrun); `--append` adds it to bench/results/teardown.md.
Run as root:

    .venv/bin/python bench/teardown_bench.py run --where both --label before --lock /work/locks/heavy.lock
    .venv/bin/python bench/teardown_bench.py report --label before --append
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from common import REPO, RESULTS, machine

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster

PYTHON = sys.executable
RUNS_FILE = RESULTS / "teardown-runs.jsonl"
NOTE = RESULTS / "teardown.md"
JOBS = {"fsdp": REPO / "jobs" / "compare" / "fsdp.yaml", "ddp": REPO / "jobs" / "compare" / "ddp.yaml"}
LAUNCHERS = ("torchrun", "torchrun-tee", "torchrun-redirect", "distrun")
BASELINE = "torchrun"
NPROC = 2
HOSTS = 3
RUN_TIMEOUT = {"local": 240.0, "hosts": 480.0}
# What an abort at exit leaves in the output: libstdc++'s terminate handler, faulthandler
# (enabled by torchrun's @record), torchrun's failure summary, distrun's verdict.
ABORT = re.compile(r"terminate called without an active exception|Fatal Python error: Aborted|SIGABRT|"
                   r"exitcode\s*:\s*-6\b|signal 6\b")
LOCK_PAUSE = 20.0
FINAL = re.compile(r'DISTRUN_METRICS \{"final": true')


@dataclass(frozen=True)
class Run:
    """One launch and what came of it; one line of teardown-runs.jsonl."""

    label: str
    where: str
    job: str
    launcher: str
    round: int
    rc: int | None
    outcome: str  # ok | abort | fail | timeout
    final_line: bool
    seconds: float
    started: str
    switch_interval: float | None
    tail: str


def job_file(checkout: Path, job: str) -> Path:
    return checkout / JOBS[job].relative_to(REPO)


def job_args(checkout: Path, job: str, steps: int) -> tuple[str, list[str]]:
    """The compare job's script and args from its YAML, with fewer steps so a run is short."""
    spec = yaml.safe_load(job_file(checkout, job).read_text())
    return spec["script"], [*map(str, spec["args"]), "--steps", str(steps)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_flags(launcher: str, log_dir: Path) -> list[str]:
    if launcher == "torchrun-tee":
        return ["--tee", "3"]
    if launcher == "torchrun-redirect":
        return ["--log-dir", str(log_dir), "--redirects", "3"]
    return []


def classify(rc: int | None, text: str) -> str:
    if rc is None:
        return "timeout"
    if rc == 0:
        return "ok"
    return "abort" if ABORT.search(text) else "fail"


def files_text(directory: Path) -> str:
    """Everything under a directory (worker log files, distrun's job directory), as text."""
    parts = [p.read_text(errors="replace") for p in sorted(directory.rglob("*")) if p.is_file()
             and p.suffix in ("", ".log", ".txt", ".json", ".jsonl")]
    return "\n".join(parts)


def decoded(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def run_command(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, stdout + stderr); on timeout the whole process group is killed."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
            return proc.returncode, out + err
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return None, decoded(out) + decoded(err)


def rounds_done(label: str, where: str, pairs: list[tuple[str, str]]) -> int:
    """Complete rounds of `label` at `where` so far: the fewest runs any (job, launcher) pair has."""
    counts = Counter((str(r["job"]), str(r["launcher"])) for r in load(label) if r["where"] == where)
    return min(counts[pair] for pair in pairs)


@contextmanager
def held(lock: Path | None) -> Iterator[None]:
    """Hold an exclusive flock on `lock` (nothing when None)."""
    if lock is None:
        yield
        return
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Bench:
    """Runs batches: launchers x jobs, round by round, appending each run to RUNS_FILE."""

    def __init__(self, args: argparse.Namespace, scratch: Path) -> None:
        self.args = args
        self.scratch = scratch
        self.cluster: Cluster | None = None
        self.inventory: Path | None = None
        self.ports = itertools.count(29400)
        self.pairs = [(job, launcher) for job in args.jobs for launcher in args.launchers]
        self.site = scratch / "site"
        if args.switch_interval is not None:
            # Amplifier: a gloo thread waiting for the GIL gets it only when the main thread lets go
            # of it by itself, not by the interpreter's forced switch every 5 ms.
            self.site.mkdir()
            (self.site / "sitecustomize.py").write_text(
                f"import sys\nsys.setswitchinterval({args.switch_interval})\n")

    def argv(self, job: str, launcher: str, run_dir: Path) -> list[str]:
        checkout = self.args.checkout
        script, args = job_args(checkout, job, self.args.steps)
        if launcher == "distrun":
            inv = ["-i", str(self.inventory)] if self.inventory else []
            return [PYTHON, "-m", "orchestrator", "launch", str(job_file(checkout, job)), *inv, "--no-live",
                    "--metrics-lines", "--",
                    "--steps", str(self.args.steps)]
        flags = torchrun_flags(launcher, run_dir / "torchrun-logs")
        if self.cluster is None:
            return [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC), "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), *flags, script, *args]
        addrs = [self.cluster.addr(i) for i in range(HOSTS)]
        # The hosts share this machine's filesystem; torchrun makes a directory of its own per host
        # under --log-dir, and --tee's default one under TMPDIR.
        remote = (f"cd {checkout} && OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 TMPDIR={run_dir} "
                  f"{PYTHON} -m torch.distributed.run "
                  f"--nnodes {HOSTS} --nproc-per-node {NPROC} --node-rank %n --master-addr {addrs[0]} "
                  f"--master-port {next(self.ports)} {shlex.join(flags)} {script} {shlex.join(args)}")
        return ["pdsh", "-R", "ssh", "-w", ",".join(addrs), remote]

    def env(self, run_dir: Path) -> dict[str, str]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTRUN_HOME": str(run_dir / "distrun-home"),
               "TMPDIR": str(run_dir)}  # torchrun --tee's own log directory lands in the run directory
        if self.args.switch_interval is not None:
            env["PYTHONPATH"] = str(self.site)
        if self.cluster is not None:
            env["PDSH_SSH_ARGS"] = f"-F {self.cluster.ssh_config} -x -l%u %h"
        return env

    def one(self, job: str, launcher: str, round_no: int) -> Run:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{job}-{launcher}-", dir=self.scratch))
        where = "hosts" if self.cluster else "local"
        began, started = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S")
        rc, text = run_command(self.argv(job, launcher, run_dir), self.args.checkout, self.env(run_dir),
                               RUN_TIMEOUT[where])
        if rc is None and self.cluster is not None:
            for i in range(HOSTS):
                self.cluster.kill_all(i)
        seconds = time.monotonic() - began
        text += "\n" + files_text(run_dir)
        outcome = classify(rc, text)
        shutil.rmtree(run_dir, ignore_errors=True)
        interesting = [line for line in text.splitlines() if ABORT.search(line) or "Error" in line]
        return Run(label=self.args.label, where=where, job=job, launcher=launcher, round=round_no, rc=rc,
                   outcome=outcome, final_line=bool(FINAL.search(text)), seconds=round(seconds, 1),
                   started=started, switch_interval=self.args.switch_interval,
                   tail="" if outcome == "ok" else "\n".join(interesting[-12:])[-2000:])

    def batch(self, where: str) -> list[Run]:
        """Rounds at `where` until `--minutes` would be exceeded or the label has `--rounds` of them."""
        deadline = time.monotonic() + self.args.minutes * 60
        runs: list[Run] = []
        round_seconds = 0.0
        while time.monotonic() + round_seconds <= deadline:
            round_no = rounds_done(self.args.label, where, self.pairs)
            if round_no >= self.args.rounds:
                break
            began = time.monotonic()
            shift = round_no % len(self.pairs)
            for job, launcher in self.pairs[shift:] + self.pairs[:shift]:
                run = self.one(job, launcher, round_no)
                runs.append(run)
                with RUNS_FILE.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(run)) + "\n")
                print(f"round {round_no} {where} {job:4} {launcher:17} {run.outcome:7} {run.seconds:6.1f} s",
                      flush=True)
            round_seconds = time.monotonic() - began
        return runs

    def batch_at(self, where: str) -> list[Run]:
        if where == "local":
            return self.batch(where)
        with Cluster(HOSTS) as cluster:
            self.cluster = cluster
            self.inventory = cluster.write_inventory(self.scratch / "inventory.yaml")
            try:
                return self.batch(where)
            finally:
                self.cluster, self.inventory = None, None


def run_batches(args: argparse.Namespace) -> int:
    """One batch per place; with --lock, batches (each holding the lock) until --rounds are done."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    places = ["local", "hosts"] if args.where == "both" else [args.where]
    with tempfile.TemporaryDirectory(prefix="teardown-bench-") as tmp:
        bench = Bench(args, Path(tmp))
        while True:
            pending = [w for w in places if rounds_done(args.label, w, bench.pairs) < args.rounds]
            for where in pending:
                with held(args.lock):
                    runs = bench.batch_at(where)
                counts = Counter((r.launcher, r.outcome) for r in runs)
                print(f"batch at {where}: " + ", ".join(f"{launcher} {outcome} {n}"
                                                        for (launcher, outcome), n in sorted(counts.items())),
                      flush=True)
                if args.lock is not None:
                    time.sleep(LOCK_PAUSE)  # let whoever waits for the lock take it
            if args.lock is None or not pending:
                return 0


# -- report ---------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_two_sided(a: int, b: int, c: int, d: int) -> float:
    """Fisher's exact test p-value (two-sided) for the table [[a, b], [c, d]]."""
    row1, col1, n = a + b, a + c, a + b + c + d

    def prob(x: int) -> float:
        return math.comb(col1, x) * math.comb(n - col1, row1 - x) / math.comb(n, row1)

    observed = prob(a)
    low, high = max(0, row1 + col1 - n), min(row1, col1)
    return min(1.0, sum(p for x in range(low, high + 1) if (p := prob(x)) <= observed * (1 + 1e-9)))


def load(label: str) -> list[dict[str, object]]:
    if not RUNS_FILE.exists():
        return []
    lines = RUNS_FILE.read_text(encoding="utf-8").splitlines()
    return [row for row in map(json.loads, lines) if row["label"] == label]


def table(rows: list[dict[str, object]]) -> list[str]:
    """Per place and job: each launcher's runs, aborts, other failures, rate and test vs torchrun."""
    out = ["| where | job | launcher | runs | aborts | other failures | abort rate (95% CI) | "
           "Fisher p vs torchrun |", "|---|---|---|---|---|---|---|---|"]
    cells: dict[tuple[object, object, object], Counter[object]] = {}
    for row in rows:
        cells.setdefault((row["where"], row["job"], row["launcher"]), Counter())[row["outcome"]] += 1
    for (where, job, launcher), count in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                              LAUNCHERS.index(kv[0][2]))):
        n, k = sum(count.values()), count["abort"]
        other = n - k - count["ok"]
        low, high = wilson(k, n)
        base = cells.get((where, job, BASELINE), Counter())
        bn, bk = sum(base.values()), base["abort"]
        p = "" if launcher == BASELINE else f"{fisher_two_sided(k, n - k, bk, bn - bk):.3f}"
        out.append(f"| {where} | {job} | {launcher} | {n} | {k} | {other} | "
                   f"{k / n:.1%} ({low:.1%}-{high:.1%}) | {p} |")
    return out


def report(args: argparse.Namespace) -> int:
    rows = load(args.label)
    if not rows:
        sys.exit(f"teardown_bench: no runs labelled {args.label!r} in {RUNS_FILE}")
    first, last = min(str(r["started"]) for r in rows), max(str(r["started"]) for r in rows)
    body = [f"## Counts: {args.label}", "",
            f"Runs {first} to {last}; machine: {machine()}; every batch held /work/locks/heavy.lock.", "",
            *table(rows), ""]
    aborted = [r for r in rows if r["outcome"] == "abort"]
    if aborted:
        with_final = sum(1 for r in aborted if r["final_line"])
        body += [f"Of the {len(aborted)} aborts, {with_final} came after the job's final metrics line.", ""]
    print("\n".join(body))
    if args.append:
        with NOTE.open("a", encoding="utf-8") as out:
            out.write("\n" + "\n".join(body))
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="alternating runs, in batches")
    run.add_argument("--where", choices=["local", "hosts", "both"], required=True)
    run.add_argument("--label", required=True, help="what the runs count, e.g. before or after")
    run.add_argument("--rounds", type=int, default=50, help="stop once the label has this many rounds (default 50)")
    run.add_argument("--minutes", type=float, default=14.0, help="start no round past this in a batch (default 14)")
    run.add_argument("--lock", type=Path, help="hold this flock during each batch and keep going, batch after "
                                               "batch, until --rounds are done (default: one batch per place)")
    run.add_argument("--steps", type=int, default=2, help="training steps per run (the compare set has 10)")
    run.add_argument("--jobs", type=lambda s: s.split(","), default=list(JOBS))
    run.add_argument("--launchers", type=lambda s: s.split(","), default=list(LAUNCHERS))
    run.add_argument("--checkout", type=lambda s: Path(s).resolve(), default=REPO,
                     help="run the jobs (and distrun) of this source tree, e.g. an export of the commit "
                          "before a fix (default: this one)")
    run.add_argument("--switch-interval", type=float, help="amplifier, local only: set the workers' "
                                                           "sys.setswitchinterval to this many seconds")
    run.set_defaults(func=run_batches)
    rep = commands.add_parser("report", help="the counts of one label as a markdown table")
    rep.add_argument("--label", required=True)
    rep.add_argument("--append", action="store_true", help=f"append the table to {NOTE.relative_to(REPO)}")
    rep.set_defaults(func=report)
    args = parser.parse_args(argv)
    for name, allowed in (("jobs", JOBS), ("launchers", LAUNCHERS)):
        unknown = [v for v in getattr(args, name, []) if v not in allowed]
        if unknown:
            parser.error(f"--{name}: unknown {unknown[0]!r} (choose from {', '.join(allowed)})")
    if getattr(args, "switch_interval", None) is not None and args.where != "local":
        parser.error("--switch-interval works with --where local only (ssh does not carry PYTHONPATH)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
