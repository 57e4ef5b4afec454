"""Code that runs on the hosts: stdlib-only modules shipped as source over the command's stdin.

Nothing here imports the rest of the package. The controller sends a bundle (module names
and their source) after a tiny bootstrap given in argv; the bootstrap installs the modules
under their real dotted names, so they import each other on the host as they do here.
"""

from __future__ import annotations

import json
from importlib import resources

# The bootstrap reads a bundle of N bytes from stdin, installs its modules, runs `main()`.
BOOTSTRAP = (
    "import sys,json,types\n"
    "b=json.loads(sys.stdin.buffer.read(int(sys.argv[1])))\n"
    "for n in b['pkgs']:\n"
    " p=types.ModuleType(n);p.__path__=[];sys.modules[n]=p\n"
    "for n,s in b['mods']:\n"
    " m=types.ModuleType(n);sys.modules[n]=m;exec(compile(s,'<distrun:'+n+'>','exec'),m.__dict__)\n"
    "sys.modules[b['main']].main(sys.argv[2:])\n"
)

_PACKAGES = ["orchestrator", "orchestrator.remote"]


def module_source(name: str) -> str:
    """The source text of `orchestrator.remote.<name>`."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


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
