"""What `distrun` says to a near-miss: usage errors in one line, the words other tools use for its
commands (`run`, `submit`, `status`, `cancel`, `queue`), and the flags torchrun, Slurm and pdsh
users type out of habit. A near-miss never suggests a command that stops or removes anything.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import click

# Other tools' words for distrun's commands (Slurm, SkyPilot, torchrun, pdsh habits).
OTHER_TOOLS = {
    "run": "launch", "submit": "launch", "sbatch": "launch", "srun": "launch", "torchrun": "launch",
    "status": "ps", "queue": "ps", "squeue": "ps", "list": "ps",
    "cancel": "stop", "scancel": "stop", "kill": "stop",
    "log": "logs", "tail": "logs",
}
# Commands a guess must never offer: they stop jobs or remove files.
DESTRUCTIVE = frozenset({"stop", "prune"})

PORT_HINT = ("distrun picks the master and a free port itself; to fix the port set `rendezvous: {port: N}` "
             "in the job file")
RDZV_HINT = ("torchrun's rendezvous backend; distrun runs torchrun's c10d rendezvous itself "
             "(its --backend is where the job runs: ssh, local or slurm)")
RESTARTS_HINT = ("torchrun's restarts in place; distrun's restart the whole job, on a spare host if one was lost: "
                 "`restarts: {max: N}` in the job file")
# pdsh's and clush's host selection, on every command that selects hosts.
PDSH_FLAGS = {
    "-w": "pdsh's host list; distrun's is --nodes RANGE, e.g. --nodes 'node[0-3]'",
    "-a": "pdsh's every host; distrun's is --all",
}
# The `deepspeed` launcher's flags (its --master_port and --master_addr are torchrun's, below).
DEEPSPEED_NODES = "DeepSpeed's node count; distrun's is --nnodes K"
DEEPSPEED_GPUS = "DeepSpeed's processes per host; distrun's is --nproc-per-node N, or slots=N in a hostfile given as -i"
DEEPSPEED_FLAGS = {
    "--hostfile": "DeepSpeed's hostfile; distrun reads it as the inventory: -i HOSTFILE",
    "--include": "DeepSpeed's host selection; distrun's is --nodes RANGE, e.g. --nodes 'worker-[0-1]', "
                 "and -x/--exclude RANGE leaves hosts out",
    "--num_nodes": DEEPSPEED_NODES, "--num-nodes": DEEPSPEED_NODES,
    "--num_gpus": DEEPSPEED_GPUS, "--num-gpus": DEEPSPEED_GPUS,
    "--launcher": "DeepSpeed's pdsh, openmpi or slurm runner; distrun's is --backend ssh|local|slurm",
}
# Launch flags of torchrun and Slurm that distrun spells otherwise or sets itself.
LAUNCH_FLAGS = {
    "-N": "Slurm's node count; distrun's is --nnodes K",
    "--standalone": "distrun sets up the rendezvous itself; for one host give --nnodes 1 or --backend local",
    "--master-port": PORT_HINT, "--master_port": PORT_HINT, "--master-addr": PORT_HINT,
    "--master_addr": PORT_HINT, "--rdzv-endpoint": PORT_HINT, "--rdzv_endpoint": PORT_HINT,
    "--rdzv-backend": RDZV_HINT, "--rdzv_backend": RDZV_HINT,
    "--max-restarts": RESTARTS_HINT, "--max_restarts": RESTARTS_HINT,
    **PDSH_FLAGS,
    **DEEPSPEED_FLAGS,
}


def one_line(exc: click.ClickException) -> str:
    """A click error as distrun's other errors read: `distrun: error: what (see `distrun CMD --help`)`;
    pdsh's `-w` and `-a` get distrun's spelling, another unknown option the near ones only."""
    message = exc.format_message().strip()
    if isinstance(exc, click.NoSuchOption):
        habit = PDSH_FLAGS.get(exc.option_name or "")
        close = near_options(exc.option_name, exc.ctx)
        message = (f"{exc.option_name}: not an option of distrun ({habit})" if habit else
                   f"{exc.option_name}: no such option" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    ctx = exc.ctx if isinstance(exc, click.UsageError) else None
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None and "--help" not in message else ""
    return f"distrun: error: {message}{where}"


def typos(a: str, b: str) -> int:
    """The typos between `a` and `b`: letters added, dropped, changed, or two swapped (each counts 1)."""
    previous = list(range(len(b) + 1))
    before: list[int] = []
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], before[j - 2] + 1)
        before, previous = previous, row
    return previous[-1]


def near(word: str, choices: Iterable[str]) -> list[str]:
    """The choices a typo or two away from `word` (at most one for every 3 letters of it, at least
    one; leading dashes aside), closest first: `--lr` is near nothing, `--nodse` is near `--nodes`."""
    bare = word.lstrip("-")
    limit = max(1, len(bare) // 3)
    found = sorted((typos(bare, c.lstrip("-")), c) for c in set(choices))
    return [c for d, c in found if d <= limit]


def near_options(option: str | None, ctx: click.Context | None) -> list[str]:
    """The long options of `ctx`'s command near `option` (none without a context)."""
    if not option or ctx is None:
        return []
    longs = {o for p in ctx.command.params if isinstance(p, click.Option) and not p.hidden for o in p.opts
             if o.startswith("--") and o not in ctx.help_option_names}
    # torchrun's spelling (--nproc_per_node) beside distrun's (--nproc-per-node): suggest distrun's.
    return near(option, {o for o in longs if o.replace("_", "-") == o or o.replace("_", "-") not in longs})


def unknown_command(name: str, commands: list[str]) -> str:
    """The error for a command distrun does not have: another tool's word mapped, else the
    closest command that changes nothing."""
    if name in OTHER_TOOLS:
        return f"no command {name!r}: distrun's is `{OTHER_TOOLS[name]}` (distrun {OTHER_TOOLS[name]} --help)"
    safe = [c for c in commands if c not in DESTRUCTIVE]
    close = difflib.get_close_matches(name, safe, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "`distrun --help` lists the commands"
    return f"no command {name!r} ({hint})"


def launch_flag_hint(option: str) -> str:
    """What a torchrun or Slurm user meant by `option` on `distrun launch` ("" when not known)."""
    return LAUNCH_FLAGS.get(option.split("=", 1)[0], "")


def node_count_hint(nodes: tuple[str, ...]) -> str:
    """The error for `--nodes 2` (Slurm's node count) given as a host range ("" when none is)."""
    count = next((value for value in nodes if value.strip().isdigit()), None)
    if count is None:
        return ""
    return (f"--nodes {count}: --nodes takes host names (a range like 'node[0-1]'); "
            f"for {count} hosts give --nnodes {count}")


class HintedGroup(click.Group):
    """The `distrun` group: an unknown command gets `unknown_command`'s answer."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                            list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            raise click.UsageError(unknown_command(name, self.list_commands(ctx)), ctx)
        return super().resolve_command(ctx, args)
