"""What the job's python finds: its torch (version, CUDA, NCCL) and its entry point. Stdlib only.

torch's version is that of the torch `import torch` finds, which is not always the installed
distribution's (a source tree or a stand-in on PYTHONPATH, a torch/ beside the job's script). It is
found without importing it (importlib's find_spec) and read from its version.py; only a torch
without one is imported (remote/probe.py decides when).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
from importlib import util
from typing import Any

SUBPROCESS_WAIT = 10.0

# ---------------------------------------------------------------- torch


TORCH_UNKNOWN = {"cuda": None, "cuda_available": None, "nccl": None, "cudnn": None, "gloo": None,
                 "nccl_available": None, "error": None, "control_plane": None}
CONTROL_PLANE = os.path.join("distributed", "elastic", "control_plane.py")


def torch_version_py() -> dict[str, Any] | None:
    """torch/version.py's literal values without importing torch: {} when it has no such file,
    None when torch is not installed."""
    spec = util.find_spec("torch")
    if spec is None:
        return None
    for where in spec.submodule_search_locations or []:
        values = _assignments(os.path.join(where, "version.py"))
        if "__version__" in values:
            return values
    return {}


def torch_control_plane() -> bool | None:
    """Whether the torch `import torch` finds has the control plane that serves a rank's Flight
    Recorder (torch.distributed.elastic.control_plane), from its files; None without torch."""
    spec = util.find_spec("torch")
    if spec is None:
        return None
    return any(os.path.isfile(os.path.join(where, CONTROL_PLANE)) for where in spec.submodule_search_locations or [])


def torch_version() -> str | None:
    """The version of the torch `import torch` finds: its version.py, else what the import says."""
    values = torch_version_py()
    if values is None:
        return None
    return values.get("__version__") or imported_version()


def imported_version() -> str | None:
    """`torch.__version__` of an imported torch (one without version.py); None when it fails."""
    try:
        import torch
    except Exception:  # a broken torch fails in many ways; torch_imported reports how
        return None
    version = getattr(torch, "__version__", None)
    return str(version) if version is not None else None


def torch_from_files() -> dict[str, Any]:
    """torch's version and CUDA version, as `torch.version` has them, importing torch only when
    it has no version.py."""
    values = torch_version_py()
    if values is None:
        return {**TORCH_UNKNOWN, "imported": False, "version": None, "error": "torch is not installed"}
    return {**TORCH_UNKNOWN, "imported": False, "version": values.get("__version__") or imported_version(),
            "cuda": values.get("cuda"), "control_plane": torch_control_plane()}


def job_sys_path(python: str, cwd: str | None, env: dict[str, str]) -> list[str] | None:
    """sys.path of `python` started in `cwd` with `env` over this environment, `cwd` first as a
    script's directory is (unless the env asks for safe paths); None when that python cannot tell.

    The python asked imports nothing (`sys` is built in, the answer is a repr): a module planted
    in `cwd` is looked up, never run."""
    where = os.path.expanduser(cwd) if cwd else None
    if where is not None and not os.path.isdir(where):
        where = None  # not made yet (sync makes it): nothing can be imported from it
    found = own_sys_path(python, env)
    if found is None:
        try:
            result = subprocess.run([python, "-c", "import sys; print(repr(sys.path))"],
                                    env={**os.environ, **env}, cwd=where, capture_output=True,
                                    timeout=SUBPROCESS_WAIT, check=True)
            found = ast.literal_eval(result.stdout.decode().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, SyntaxError, IndexError):
            return None
    return [entry or where for entry in found if entry or where]


def own_sys_path(python: str, env: dict[str, str]) -> list[str] | None:
    """What `python -c` would have on sys.path (its '' first), known without starting it: when
    `python` is this interpreter and `env` sets nothing that moves sys.path (PYTHON*, HOME, PATH);
    else None. sys.path is as this python started (the probe asks first). Saves every host's
    probe a second python (~30 ms of CPU) at each launch."""
    if any(key.startswith("PYTHON") or key in ("HOME", "PATH") for key in env):
        return None
    if os.path.abspath(shutil.which(python) or python) != sys.executable:
        return None
    base = sys.path[1:] if sys.path[:1] == [""] else sys.path  # '' is this -c's own first entry
    return ([] if os.environ.get("PYTHONSAFEPATH") else [""]) + base


def import_like_the_job(options: dict[str, Any]) -> None:
    """Look up modules (torch) from here on as the job's python would (`import_from`)."""
    context = options.get("import_from")
    if not context:
        return
    python = context.get("python") or sys.executable
    path = job_sys_path(os.path.expanduser(python), context.get("cwd"), dict(context.get("env") or {}))
    if path is not None:
        sys.path[:] = path
        importlib.invalidate_caches()


def _assignments(path: str) -> dict[str, Any]:
    """Literal `NAME = value` assignments at the top of a Python file; {} when unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    with contextlib.suppress(ValueError):
                        found[target.id] = ast.literal_eval(node.value)
    return found


def torch_imported() -> dict[str, Any]:
    """What the torch this python imports reports, NCCL and cuDNN as loaded."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # a broken install fails in many ways; all are reported
        version = (torch_version_py() or {}).get("__version__")
        return {**TORCH_UNKNOWN, "imported": False, "version": version, "error": _one_line(exc)}
    cuda_ok = bool(torch.cuda.is_available())
    return {
        "imported": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda_ok,
        "nccl": _version_text(torch.cuda.nccl.version()) if cuda_ok else None,
        "cudnn": _version_text(torch.backends.cudnn.version()) if cuda_ok else None,
        "gloo": bool(dist.is_available() and dist.is_gloo_available()),
        "nccl_available": bool(dist.is_available() and dist.is_nccl_available()),
        "error": None,
        "control_plane": torch_control_plane(),
    }


def _version_text(value: Any) -> str | None:
    """(2, 21, 5) -> "2.21.5"; numbers as they are; None stays None."""
    if value is None:
        return None
    return ".".join(str(part) for part in value) if isinstance(value, (tuple, list)) else str(value)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ---------------------------------------------------------------- the job's entry


def entry_facts(entry: dict[str, Any], cwd: str | None) -> dict[str, Any]:
    """Whether the job's script or module is there: {kind, name, ok, found, error}.

    Args:
        entry: {"script": PATH} or {"module": NAME}, as the job names it.
        cwd: The job's workdir, which a relative script is relative to (None: this directory).

    Returns:
        `found` is the file (the module's origin) when `ok`; `error` says why not otherwise.
    """
    if entry.get("module"):
        name = str(entry["module"])
        found, error = find_module(name)
        return {"kind": "module", "name": name, "ok": error is None, "found": found, "error": error}
    name = str(entry.get("script") or "")
    path = os.path.join(os.path.expanduser(cwd or "."), os.path.expanduser(name))
    error = None
    if not os.path.exists(path):
        error = "no such file" if cwd is None or os.path.isdir(os.path.expanduser(cwd)) \
            else f"no such file (the workdir {cwd} does not exist)"
    elif not os.path.isfile(path):
        error = "not a file"
    elif not os.access(path, os.R_OK):
        error = "not readable"
    return {"kind": "script", "name": name, "ok": error is None, "found": os.path.abspath(path), "error": error}


def find_module(name: str) -> tuple[str | None, str | None]:
    """(where the module is, None) or (None, why it cannot be found), as `python -m NAME` would
    look for it. Parent packages are imported (their output goes to stderr, not the facts)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            spec = util.find_spec(name)
            if spec is not None and spec.submodule_search_locations is not None:
                # `python -m package` runs package.__main__
                main_spec = util.find_spec(f"{name}.__main__")
                if main_spec is None:
                    return None, f"{name} is a package without a __main__ module"
                spec = main_spec
    except Exception as exc:  # a parent package that fails to import fails in any way; reported
        return None, _one_line(exc)
    if spec is None:
        return None, f"No module named {name!r}"
    return spec.origin, None
