"""Code that runs on the hosts: stdlib-only modules shipped as source over the command's stdin.

Nothing here imports the rest of the package. The controller sends a bundle (module names
and their source) after a tiny bootstrap given in argv; the bootstrap installs the modules
under their real dotted names, so they import each other on the host as they do here.

Every Python distrun starts runs with safe paths: the directory Python would put first on
sys.path (the working directory for `-c` and `-m`, a script's own directory) is not searched,
so a module another user planted there (in /tmp, in a shared workdir) is never imported.
`python -P` does that from Python 3.11 on; `SAFE_PATH` does the same as a program's first
line on any Python 3, which is what the bootstrap (whose host python is not known yet) and
`module_argv` on an older python use.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

# What `-P` does, unless the interpreter already did it (-P, -I, PYTHONSAFEPATH): drop sys.path[0].
# One line, so that a command line holding it stays one line (the dry run shows argv as comments).
SAFE_PATH = "import sys;getattr(sys.flags,'safe_path',0) or sys.flags.isolated or sys.path.pop(0)"
# The bootstrap reads a bundle of N bytes from stdin, installs its modules, runs `main()`.
BOOTSTRAP = SAFE_PATH + "\n" + (
    "import json,types\n"
    "b=json.loads(sys.stdin.buffer.read(int(sys.argv[1])))\n"
    "for n in b['pkgs']:\n"
    " p=types.ModuleType(n);p.__path__=[];sys.modules[n]=p\n"
    "for n,s in b['mods']:\n"
    " m=types.ModuleType(n);sys.modules[n]=m;exec(compile(s,'<distrun:'+n+'>','exec'),m.__dict__)\n"
    "sys.modules[b['main']].main(sys.argv[2:])\n"
)
# One program of N bytes from stdin, run with `python -I -S` (isolated, no site: a few ms less
# of the host's CPU): its `main(argv)` gets the arguments after N. For a program run once per
# host per command (remote/guard.py), that imports only what Python has built in.
LEAN_BOOTSTRAP = (
    "import sys;g={'__name__':'distrun'};"
    "exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'<distrun>','exec'),g);g['main'](sys.argv[2:])"
)

_PACKAGES = ["orchestrator", "orchestrator.remote"]
HOST_DIR = "~/.distrun"  # each host's distrun directory (remote/config.py's default host_dir)
# The programs a host runs by name, written by its supervisor to the job's bin/ (remote/programs.py):
# torchrun's entry (failure records) and every rank's (its Flight Recorder served).
TORCHRUN_PROGRAM = "distrun_torchrun.py"
WORKER_PROGRAM = "distrun_worker.py"
# What remote/supervisor.py imports, dependencies first: shipped before it wherever it runs or
# where a program finds a job's processes through it.
SUPERVISOR_IMPORTS = ["config", "ftforward", "gpu", "private", "provenance", "safedirs", "sockdir", "leader", "redact",
                      "stream", "linestore", "follow", "tail", "workerfail", "programs", "relay", "flightrec", "frpoll",
                      "rdzvconn"]


@functools.cache
def module_source(name: str) -> str:
    """The source text of `orchestrator.remote.<name>`, read once per process (every host gets the same)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def host_job_dir(job_id: str) -> str:
    """A job's directory on every host, `~` for the host's home (the supervisor expands it)."""
    return f"{HOST_DIR}/jobs/{job_id}"


def program_path(job_id: str, program: str) -> str:
    """Where a host's supervisor writes one of the shipped programs for a job."""
    return f"{host_job_dir(job_id)}/bin/{program}"


def program_sources() -> dict[str, str]:
    """{file name: source} of the programs the supervisor writes to a job's bin/."""
    return {name: module_source(name.removesuffix(".py")) for name in (TORCHRUN_PROGRAM, WORKER_PROGRAM)}


def bundle(main: str, modules: list[str], extra: dict[str, str] | None = None) -> bytes:
    """Serialise remote modules (dependencies first) for the bootstrap.

    Args:
        main: short name of the module whose `main(argv)` runs on the host.
        modules: short names of the remote modules to ship, dependencies first; `main` last.
        extra: other top-level modules to ship as {import name: source} (e.g. pynvml).

    Returns:
        The bytes to write to the command's stdin before any control message.
    """
    mods = [[k, v] for k, v in (extra or {}).items()]
    mods += [[f"{__name__}.{name}", module_source(name)] for name in modules]
    payload = {"pkgs": _PACKAGES, "mods": mods, "main": f"{__name__}.{main}"}
    return json.dumps(payload).encode()


def bootstrap_argv(python: str, payload: bytes, *tags: str) -> list[str]:
    """argv that runs a bundle with the host's python; `tags` show up in `ps` (job id, role)."""
    return [python, "-c", BOOTSTRAP, str(len(payload)), *tags]


def lean_argv(python: str, program: bytes, *args: str) -> list[str]:
    """argv that runs `program` (one module's source, stdlib built-ins only) with the host's
    python, isolated and without site; the program's source follows on stdin."""
    return [python, "-I", "-S", "-c", LEAN_BOOTSTRAP, str(len(program)), *args]


def module_argv(python: str, module: str, dash_p: bool) -> list[str]:
    """argv that runs `python -m module` with safe paths; the module's arguments follow.

    Args:
        python: The interpreter.
        module: The module to run as __main__ (e.g. torch.distributed.run).
        dash_p: The interpreter is Python 3.11 or newer: `-P -m module`. Else (older, or not
            known) a `-c` line that drops sys.path[0] and runs the module as `-m` would.
    """
    if dash_p:
        return [python, "-P", "-m", module]
    return [python, "-c", f"{SAFE_PATH};import runpy;runpy.run_module({module!r},run_name='__main__',alter_sys=True)"]
