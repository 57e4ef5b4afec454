"""The worker entry torchrun runs for every rank: serves torch's control plane (the Flight Recorder)
and runs the job's script or module exactly as torchrun would have run it.

torchrun starts each worker as `python -u distrun_worker.py TARGET ARGS...` in place of
`python -u TARGET ARGS...` (a script) or `python -u -m MODULE ARGS...` (TARGET is `-m MODULE`).
This program then makes the process what that one would have been: `sys.argv`, `sys.orig_argv`,
`sys.path[0]`, a fresh `__main__` with the script's `__file__` (multiprocessing's spawn re-imports
the script by that path, so DataLoader workers and torch.multiprocessing see the script, never this
program), the exit code, signals and tracebacks (this program's own frame is cut from them).

The control plane is entered once the program has imported torch (a hook on that import), so the
program's own order of imports and environment is kept, and a program that never imports torch
pays nothing: `worker_main()` on `$DISTRUN_WORKER_SOCKETS/rank<RANK>.sock`, the path
remote/flightrec.py fetches from. `TORCH_WORKER_SERVER_SOCKET` is set only while it is entered,
and faulthandler is left as it was (worker_main's `@record` turns it on). A torch without the
control plane runs the program unchanged. torch's server logs its start and end on stderr;
those lines are dropped, so the program's stderr is its own. A program that enters worker_main()
itself on the same socket is yielded it (`_yielding`): the entry's server is shut down and its
socket removed just before the program's server binds, whatever the program's order of imports.

The supervisor writes this file to `~/.distrun/jobs/<id>/bin/` on the host (remote/programs.py);
stdlib-only, and it imports nothing of distrun, nor typing or __future__: what it imports is in
the program's sys.modules before the program runs, so it imports as little as it can (untyped).
"""

import os
import sys

SOCKETS = "DISTRUN_WORKER_SOCKETS"
SERVER_SOCKET = "TORCH_WORKER_SERVER_SOCKET"
SERVE_WAIT = 10.0  # seconds torch's server may take to serve before it is shut down
LAST = ".last.json"  # beside the rank's socket: its Flight Recorder record as it ended (remote/frpoll.py)
LAST_SETTLE = 0.3  # seconds the record may take to show the last collective completed
_serving = []  # the entered worker_main(), its socket and process, closed (the socket removed) at the end


def _serve_control_plane():
    """Enter torch's worker_main() on this rank's socket; nothing where torch has no control plane."""
    sockets = os.environ.get(SOCKETS)
    if not sockets or _serving:
        return
    path = os.path.join(sockets, f"rank{os.environ.get('RANK', '0')}.sock")
    torch = sys.modules.get("torch")
    where = os.path.dirname(getattr(torch, "__file__", None) or "")
    if not os.path.isfile(os.path.join(where, "distributed", "elastic", "control_plane.py")):
        return  # a torch without the control plane: nothing imported that the program would not
    try:
        import faulthandler

        from torch.distributed.elastic import control_plane
    except Exception:
        return
    was_on = faulthandler.is_enabled()
    before = os.environ.get(SERVER_SOCKET)
    try:
        if os.path.exists(path):
            os.remove(path)  # an earlier attempt's: torch does not bind over it
        os.environ[SERVER_SOCKET] = path
        serving = control_plane.worker_main()
        _quiet(serving.__enter__)
        _serving.append((serving, path, os.getpid()))
        control_plane._worker_server = _yielding(control_plane._worker_server)
    except Exception:
        pass
    finally:
        if before is None:
            os.environ.pop(SERVER_SOCKET, None)
        else:
            os.environ[SERVER_SOCKET] = before
        if not was_on:
            faulthandler.disable()


def _yielding(server):
    """torch's `_worker_server`, made to yield this rank's socket to the program's own worker_main()
    on the same path: the entry's server is shut down and its socket removed first, whatever the
    program did before (imported torch, removed the socket, set TORCH_WORKER_SERVER_SOCKET)."""

    def yielding(socket_path):
        _give_up(socket_path)
        return server(socket_path)

    return yielding


def _give_up(path):
    """Shut the entry's own server at `path` down, once it serves there (torch binds in its server's
    thread), and remove its socket; one whose socket the program removed already is left serving
    the unlinked socket (the program's server binds the path all the same)."""
    for entry in [e for e in _serving if e[1] == path and e[2] == os.getpid()]:
        _await_serving(path)
        if not os.path.exists(path):
            continue
        _serving.remove(entry)
        try:  # noqa: SIM105  (no contextlib: what this program imports is in the program's sys.modules)
            _quiet(entry[0].__exit__, None, None, None)
        except Exception:
            pass
        _remove(path)


def _remove(path):
    try:  # noqa: SIM105  (no contextlib, as above)
        os.remove(path)
    except OSError:
        pass


class _AfterTorch:
    """A finder on sys.meta_path for `torch` only: once torch's own module has run, it serves the
    control plane; it leaves sys.meta_path at its first use."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader)
        return spec


class _Then:
    """A loader that runs the real one, puts it back in the module's spec, then serves."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _serve_control_plane()


def _without_this_program():
    """sys.argv and sys.orig_argv as `python -u TARGET ARGS` has them (this program's path out)."""
    del sys.argv[0]
    orig = getattr(sys, "orig_argv", None)
    if orig:
        del orig[len(orig) - len(sys.argv) - 1]


def _path0(value):
    """sys.path[0] as Python sets it for the target, unless it is run with safe paths (-P, -I)."""
    if not (getattr(sys.flags, "safe_path", 0) or sys.flags.isolated):
        sys.path[0] = value


def _run_module(name):
    import runpy

    sys.argv[0] = "-m"
    _path0(os.getcwd())
    sys.modules["__main__"] = _fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)


def _fresh_main():
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins
    return main


def _run_script(script):
    if os.path.isdir(script) or (not os.path.isfile(script) and os.path.exists(script)):
        import runpy

        _path0(script)  # a directory or a zip file with __main__.py
        sys.modules["__main__"] = _fresh_main()
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        program = getattr(sys, "orig_argv", [sys.executable])[0]
        sys.stderr.write(f"{program}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        sys.exit(2)
    _path0(os.path.dirname(os.path.realpath(path)))
    import importlib.machinery

    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _quiet(call, *args):
    """call(*args) with the process's stderr (fd 2) on /dev/null: torch's server says that it
    listens and that it exits there, lines the program would not have printed."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        return call(*args)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _await_serving(path):
    """Wait (at most SERVE_WAIT seconds) until torch's server at `path` answers a request. Its
    shutdown() stops the server only once the server's thread serves: called before that (a
    program that ends right after importing torch, on a busy host) it does nothing, then waits
    for that thread for ever. An answered request proves the thread serves."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SERVE_WAIT)
            conn.connect(path)
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            conn.recv(1)
    except OSError:
        pass  # no socket or no answer: shut down all the same (its thread may have ended)


def _own_record(path):
    """This rank's Flight Recorder record from its own server (b"" when it gives none): gloo's, or
    NCCL's where gloo's holds no collective (on NCCL, fr_trace_json answers with no entries; the
    host's poller asks the same two, remote/flightrec.py)."""
    record = _ask_own(path, b"fr_trace_json")
    if _has_entries(record):
        return record
    nccl = _ask_own(path, b"dump_nccl_trace_json?includecollectives=true")
    return nccl if _has_entries(nccl) else record


def _ask_own(path, handler):
    """One handler's answer from this rank's own server (b"" when it gives none)."""
    import socket

    body = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SERVE_WAIT)
            conn.connect(path)
            conn.sendall(b"POST /handler/" + handler + b" HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                body += chunk
    except OSError:
        return b""
    head, _, record = body.partition(b"\r\n\r\n")
    return record if b" 200 " in head.split(b"\r\n", 1)[0] + b" " else b""


def _has_entries(record):
    import json

    try:
        return bool(json.loads(record).get("entries"))
    except Exception:
        return False


def _settled(record):
    """Whether the record's default group has completed every collective it entered (gloo retires a
    collective a moment after the call returns)."""
    import json

    try:
        status = json.loads(record).get("pg_status", {}).get("0", {})
        return int(status.get("last_completed_collective", 0)) >= int(status.get("last_enqueued_collective", 0))
    except Exception:
        return True


def _leave_last(path):
    """Fetch this rank's own Flight Recorder record from its server as the program ends (once its
    collectives settled, LAST_SETTLE at most) and leave it beside the socket (`rank<R>.last.json`, this
    user's alone) for the host's poller: the rank's final position. An answered request also proves
    the server's thread serves, as _await_serving does."""
    import time

    record = _own_record(path)
    settle = time.monotonic() + LAST_SETTLE
    while record and not _settled(record) and time.monotonic() < settle:
        time.sleep(0.02)
        record = _own_record(path)
    if not record:
        return
    final = path[:-len(".sock")] + LAST
    try:
        fd = os.open(final + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(record)
        os.replace(final + ".tmp", final)
    except OSError:
        pass


def _never_finalized(serving):
    """Keep a forked child's copy of the parent's server alive to the child's end. A child that
    runs on to the end of the program (os.fork(), no os._exit) would shut it down when the
    interpreter frees it: that shuts the listening socket it shares with the parent (whose server
    thread then aborts the parent) and waits for a server thread the child does not have."""
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(serving))


def _close_control_plane():
    while _serving:
        serving, path, pid = _serving.pop()
        if pid != os.getpid():
            _never_finalized(serving)
            continue
        try:
            _leave_last(path)
            _await_serving(path)
            _quiet(serving.__exit__, None, None, None)
        except Exception:
            pass
        _remove(path)  # the rank ends: a socket left in sock/ would only refuse connections


def main():
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        sys.stderr.write("usage: distrun_worker.py SCRIPT ARGS... | -m MODULE ARGS...\n")
        sys.exit(2)
    _without_this_program()
    if os.environ.get(SOCKETS):
        if "torch" in sys.modules:
            _serve_control_plane()
        else:
            sys.meta_path.insert(0, _AfterTorch())
    if sys.argv[0] == "-m":
        del sys.argv[0]
        _run_module(sys.argv[0])
    else:
        _run_script(sys.argv[0])


def _cut(tb):
    """A traceback without this program's frames (a hook's in an import, the entry's)."""
    import types

    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != __file__:
            frames.append(tb)
        tb = tb.tb_next
    cut = None
    for kept in reversed(frames):
        cut = types.TracebackType(cut, kept.tb_frame, kept.tb_lasti, kept.tb_lineno)
    return cut


try:
    main()
except SystemExit:
    _close_control_plane()
    raise
except BaseException as exc:
    _close_control_plane()
    # The traceback as Python prints it for the target itself; a bare raise adds no frame.
    exc.__traceback__ = _cut(exc.__traceback__)
    raise
else:
    _close_control_plane()
