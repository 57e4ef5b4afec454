"""Facts about a host, as JSON on stdout. Runs on the host with its own python, stdlib only.

Reads one JSON line of options on stdin:
    route_to: an address; report the interface whose route reaches it
    port_from: report the first free TCP port from this one (on the master only)
    port_exact: report whether exactly this port is free
    full: also report what `distrun doctor` checks (see `full_facts`)
    workdir: with `full`, where to measure free disk
    resolve: names or addresses to look up with getaddrinfo
    listen_seconds: listen on the rendezvous port (`port_exact`, else the free port found from
        `port_from`) so other hosts can test connecting, until `{"stop": true}` or end of stdin,
        at most this long; a `listening` event is printed as soon as the socket listens
    connect_to: [addr, port]: try a TCP connection (CONNECT_TIMEOUT) and report how it went
    connect_later: read `{"connect_to": [addr, port] | null, "resolve": [...], "route_to": addr}`
        from stdin after gathering the facts (waiting at most `connect_wait` seconds, default
        CONTROL_WAIT), then connect, resolve and find the route as above
    import_from: {"python": PYTHON, "cwd": DIR, "env": {...}}: find torch as the job's python
        would: PYTHON (the inventory's, a wrapper script included) with DIR first on sys.path
        (where the job's workers have it: the script's own directory, the workdir for a
        `module:` job) and ENV over this environment (its PYTHONPATH, PYTHONSAFEPATH, ...);
        without it, as this python finds it
    entry: {"script": PATH, "cwd": WORKDIR} or {"module": NAME}: whether the job's entry is
        there, found as `import_from` finds modules: a script (relative to WORKDIR) that is a readable
        file, a module that `importlib.util.find_spec` finds (importing only its parent packages;
        for a package, its __main__), reported as `entry` {kind, name, ok, found, error}

Later stdin lines are control messages: `{"stop": true}`, the `connect_to` message above, and
`{"module": "pynvml", "source": TEXT | null}`, the reply to a `need` event.

Output: event lines (the byte 0x1e, then JSON with "ev": `listening` {port, ok, error,
interfaces, hostname} or `need` {module}), then one line with the facts as JSON.

torch's version is that of the torch `import torch` finds, which is not always the installed
distribution's (a source tree or a stand-in on PYTHONPATH, a torch/ beside the job's script). It is
found without importing it (importlib's find_spec) and read from its version.py; only a torch
without one is imported. With `full`, torch is also imported on hosts with an NVIDIA GPU,
where the NCCL and cuDNN it loads matter; elsewhere the import's ~1.5 s of CPU is saved.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import json
import os
import platform
import re
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any, BinaryIO

from orchestrator.remote import pyspy
from orchestrator.remote.gpu import gpu_count, nvml_facts, smi_facts
from orchestrator.remote.output import Output
from orchestrator.remote.pyenv import entry_facts, import_like_the_job, torch_from_files, torch_imported, torch_version

PORT_SPAN = 200
CONNECT_TIMEOUT = 2.0
CONTROL_WAIT = 30.0
MODULE_WAIT = 10.0
DRAIN_TIMEOUT = 1.0
SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B

Emit = Callable[[str, dict[str, Any]], None]


# ---------------------------------------------------------------- control channel


class Inbox:
    """Control messages (one JSON object a line) read from stdin by one thread, taken by key."""

    def __init__(self, stream: BinaryIO) -> None:
        self._messages: list[dict[str, Any]] = []
        self._closed = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: BinaryIO) -> None:
        for raw in iter(stream.readline, b""):
            with contextlib.suppress(ValueError):
                message = json.loads(raw)
                if isinstance(message, dict):
                    with self._cond:
                        self._messages.append(message)
                        self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, key: str, timeout: float) -> dict[str, Any] | None:
        """The first message that has `key`; None at end of input or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for message in self._messages:
                    if key in message:
                        self._messages.remove(message)
                        return message
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return None
                self._cond.wait(left)


# ---------------------------------------------------------------- network


def interfaces() -> dict[str, list[str]]:
    """Interface name -> IPv4 addresses with prefix length, from `ip -o -4 addr`, else ioctl."""
    try:
        text = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return interfaces_by_ioctl()
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet":
            found.setdefault(parts[1], []).append(parts[3])
    return found


def interfaces_by_ioctl() -> dict[str, list[str]]:
    """The same as `interfaces()` on hosts without iproute2: one IPv4 address per interface."""
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)[20:24])
                mask = fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, request)[20:24]
            except OSError:
                found[name] = []
                continue
            found[name] = [f"{addr}/{bin(int.from_bytes(mask, 'big')).count('1')}"]
    return found


def route_iface(addr: str) -> str | None:
    """The interface the kernel would use to reach `addr`."""
    try:
        text = subprocess.run(
            ["ip", "-o", "route", "get", addr], capture_output=True, text=True, timeout=5, check=False
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return text[text.index("dev") + 1] if "dev" in text else None


def _bindable_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # torchrun's store sets it too: a port whose last connection waits in TIME_WAIT is free to it.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def port_free(port: int) -> bool:
    """Whether a TCP listener could bind `port` on every address, as torchrun's store does."""
    with _bindable_socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def first_free_port(start: int) -> int | None:
    return next((p for p in range(start, min(start + PORT_SPAN, 65536)) if port_free(p)), None)


def resolve(names: list[str]) -> dict[str, dict[str, Any]]:
    """name -> {"addrs": [IPv4/IPv6 addresses], "error": None} or {"addrs": [], "error": why}."""
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            found[name] = {"addrs": [], "error": exc.strerror or str(exc)}
            continue
        found[name] = {"addrs": sorted({str(info[4][0]) for info in infos}), "error": None}
    return found


def connect(addr: str, port: int) -> dict[str, Any]:
    """Open and close one TCP connection: {"addr", "port", "ok", "error", "ms"}."""
    began = time.monotonic()
    error = None
    try:
        sock = socket.create_connection((addr, port), timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        error = f"timed out after {CONNECT_TIMEOUT:g} s"
    except OSError as exc:
        error = (exc.strerror or str(exc)).lower()
    else:
        # Closing first leaves TIME_WAIT here, not on the master's rendezvous port.
        sock.close()
    ms = round((time.monotonic() - began) * 1000, 1)
    return {"addr": addr, "port": port, "ok": error is None, "error": error, "ms": ms}


class Listener:
    """Listens on a port and accepts connections until closed; records who connected."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted: list[str] = []
        self.error: str | None = None if port else "no free port"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        if port:
            self._listen(port)

    def _listen(self, port: int) -> None:
        sock = _bindable_socket()
        try:
            sock.bind(("0.0.0.0", port))
            # Every host of a large job may connect at once (the kernel caps this at net.core.somaxconn).
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            self.error = (exc.strerror or str(exc)).lower()
            return
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
        self._thread.start()

    @property
    def ok(self) -> bool:
        return self._thread is not None

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            while not self._stop.is_set():
                try:
                    conn, peer = sock.accept()
                except OSError:  # shut down by close()
                    return
                self.accepted.append(str(peer[0]))
                _drain(conn)

    def close(self) -> dict[str, Any]:
        """Stop listening; return {"port", "ok", "error", "accepted": [peer addresses]}."""
        self._stop.set()
        if self._sock is not None and self._thread is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            self._thread.join()
        return {"port": self.port, "ok": self.ok, "error": self.error, "accepted": self.accepted}


def _drain(conn: socket.socket) -> None:
    """Wait for the peer to close first, so the rendezvous port is left without TIME_WAIT."""
    with conn:
        conn.settimeout(DRAIN_TIMEOUT)
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass


# ---------------------------------------------------------------- GPUs


def load_pynvml(inbox: Inbox, emit: Emit) -> Any:
    """The host's own pynvml, else one the controller sends on request; None when neither."""
    with contextlib.suppress(ImportError):
        import pynvml

        return pynvml
    emit("need", {"module": "pynvml"})
    reply = inbox.take("module", MODULE_WAIT)
    if not reply or not reply.get("source"):
        return None
    module = types.ModuleType("pynvml")
    sys.modules["pynvml"] = module
    try:
        exec(compile(reply["source"], "<distrun:pynvml>", "exec"), module.__dict__)
    except Exception:  # a module that does not load is the same as none
        del sys.modules["pynvml"]
        return None
    return module


def gpu_facts(inbox: Inbox, emit: Emit) -> dict[str, Any]:
    """NVML when it loads and initialises, else nvidia-smi, else {"source": "none"}."""
    if gpu_count() or os.path.exists("/dev/nvidiactl"):
        nv = load_pynvml(inbox, emit)
        if nv is not None:
            try:
                return nvml_facts(nv)
            except Exception:  # no driver library, driver/library mismatch: fall back
                pass
    found = smi_facts()
    return found if found is not None else {"source": "none", "driver": None, "devices": []}


# ---------------------------------------------------------------- the rest of the host


def os_name() -> str:
    values: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/etc/os-release", encoding="utf-8") as fh:
        for line in fh:
            key, _, value = line.strip().partition("=")
            values[key] = value.strip('"')
    return values.get("PRETTY_NAME") or platform.platform()


def meminfo() -> dict[str, int | None]:
    """{"total": bytes, "available": bytes} from /proc/meminfo."""
    found: dict[str, int | None] = {"total": None, "available": None}
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                found["total" if key == "MemTotal" else "available"] = int(rest.split()[0]) * 1024
    return found


def space(path: str) -> dict[str, Any]:
    """{"path", "exists", "total", "free"} (bytes) of the file system holding `path`, or its
    closest existing parent when `path` does not exist."""
    at = os.path.abspath(os.path.expanduser(path))
    exists = os.path.exists(at)
    while not os.path.exists(at):
        at = os.path.dirname(at)
    try:
        st = os.statvfs(at)
    except OSError:
        return {"path": path, "exists": exists, "total": None, "free": None}
    return {"path": path, "exists": exists, "total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def memlock() -> int | None:
    """The soft `ulimit -l` in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def full_facts(options: dict[str, Any], inbox: Inbox, emit: Emit) -> dict[str, Any]:
    """What doctor checks beyond the fast facts."""
    gpu = gpu_facts(inbox, emit)
    torch = torch_imported() if gpu["devices"] else torch_from_files()
    return {
        "os": os_name(),
        "kernel": platform.release(),
        "torch_info": torch,
        "gpu": gpu,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory": meminfo(),
        "shm": space("/dev/shm") if os.path.isdir("/dev/shm") else None,
        "memlock": memlock(),
        "disk": space(options.get("workdir") or os.getcwd()),
        "pyspy": pyspy.facts(),
    }


# ---------------------------------------------------------------- DeepSpeed

DS_VERSION = re.compile(r"^version\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def deepspeed_version() -> str | None:
    """The version of the deepspeed `import deepspeed` would find, from its installed version file
    (found, not imported: importing it takes seconds); None when it is not installed."""
    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for where in spec.submodule_search_locations or []:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(os.path.join(where, "git_version_info_installed.py"), encoding="utf-8") as fh:
                found = DS_VERSION.search(fh.read())
            if found:
                return found.group(1)
    return "unknown"


def extensions_root(env: dict[str, str]) -> str:
    """Where torch JIT-builds C++ extensions: TORCH_EXTENSIONS_DIR, else its user cache directory."""
    chosen = env.get("TORCH_EXTENSIONS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return os.path.expanduser(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "torch_extensions")


def build_cwds() -> set[str]:
    """The working directories of this host's processes (a compiler building an op works in its directory)."""
    found = set()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/cwd"))
    return found


def extension_locks(env: dict[str, str]) -> dict[str, Any]:
    """torch's build locks (`<root>/[<py>/]<op>/lock`): a lock no process is building under is stale,
    and every later build of that op waits on it for ever."""
    root = extensions_root(env)
    paths = sorted(glob.glob(os.path.join(root, "*", "lock")) + glob.glob(os.path.join(root, "*", "*", "lock")))
    cwds = build_cwds() if paths else set()
    locks = []
    for path in paths:
        with contextlib.suppress(OSError):
            folder = os.path.dirname(path)
            building = any(cwd == folder or cwd.startswith(folder + os.sep) for cwd in cwds)
            locks.append({"path": path, "age_s": round(time.time() - os.stat(path).st_mtime, 1), "building": building})
    return {"root": root, "locks": locks}


# ---------------------------------------------------------------- putting it together


def facts(options: dict[str, Any], listener: Listener | None = None) -> dict[str, Any]:
    """The fast facts: what launch needs to plan. A listener already holds the port it checked."""
    result: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "torch": torch_version(),
        "gpus": gpu_count(),
        "interfaces": interfaces(),
        "home": os.path.expanduser("~"),
        "deepspeed": deepspeed_version(),
        "extensions": extension_locks(dict((options.get("import_from") or {}).get("env") or {})),
    }
    if options.get("route_to"):
        result["route_iface"] = route_iface(options["route_to"])
    if options.get("port_from"):
        result["free_port"] = listener.port if listener else first_free_port(int(options["port_from"]))
    if options.get("port_exact"):
        result["port_exact_free"] = listener.ok if listener else port_free(int(options["port_exact"]))
    if options.get("entry"):
        result["entry"] = entry_facts(options["entry"], options["entry"].get("cwd"))
    return result


def start_listener(options: dict[str, Any], out: Output) -> Listener:
    """Listen on the rendezvous port (`port_exact`, else the first free from `port_from`) and tell
    the controller at once, with what it needs to choose the master's address."""
    port = options.get("port_exact") or first_free_port(int(options.get("port_from") or 0)) or 0
    listener = Listener(int(port))
    out.event("listening", {"port": listener.port, "ok": listener.ok, "error": listener.error,
                            "interfaces": interfaces(), "hostname": socket.gethostname()})
    return listener


def connect_and_resolve(options: dict[str, Any], inbox: Inbox) -> dict[str, Any]:
    """The `connect_to` and `resolve` results, from the options and the later stdin message."""
    requests = [options]
    if options.get("connect_later"):
        requests.append(inbox.take("connect_to", float(options.get("connect_wait") or CONTROL_WAIT)) or {})
    found: dict[str, Any] = {}
    target = next((r["connect_to"] for r in requests if r.get("connect_to")), None)
    if target:
        found["connect"] = connect(str(target[0]), int(target[1]))
    names = [name for r in requests for name in r.get("resolve") or []]
    if names:
        found["resolved"] = resolve(list(dict.fromkeys(names)))
    route = next((r["route_to"] for r in requests[1:] if r.get("route_to")), None)
    if route:
        found["route_iface"] = route_iface(str(route))
    return found


def run() -> None:
    options = json.loads(sys.stdin.buffer.readline() or b"{}")
    import_like_the_job(options)
    inbox = Inbox(sys.stdin.buffer)
    out = Output(sys.stdout.buffer)
    listener = start_listener(options, out) if options.get("listen_seconds") else None
    result = facts(options, listener)
    if options.get("full"):
        result.update(full_facts(options, inbox, out.event))
    result.update(connect_and_resolve(options, inbox))
    if listener is not None:
        inbox.take("stop", float(options["listen_seconds"]))
        result["listen"] = listener.close()
    result["clock"] = time.time()
    out.line(json.dumps(result).encode())


def main(argv: list[str]) -> None:
    code = 0
    try:
        run()
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Ending the interpreter normally would wait on the inbox thread's lock on stdin.
    os._exit(code)
