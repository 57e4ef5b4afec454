"""The shipped probe: GPU facts (NVML, nvidia-smi), torch without importing it, and its
listen/connect protocol, run for real through the local transport."""

from __future__ import annotations

import io
import json
import os
import select
import socket
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path

import pytest

from orchestrator.errors import InfraError
from orchestrator.hostcheck.probe import ProbeRun
from orchestrator.remote import gpu as remote_gpu
from orchestrator.remote import probe, pyenv
from orchestrator.spec.model import NodeSpec, TransportKind
from orchestrator.transport import transport_for
from tests.helpers import plant_module

# `nvidia-smi --query-gpu=<remote_gpu.SMI_FACT_FIELDS> --format=csv,noheader,nounits` in the form
# driver 550 prints it (MiB, Enabled/Disabled, [N/A] where a field is not supported).
SMI_GPUS = """\
0, NVIDIA H100 80GB HBM3, 81559, 4, 550.54.15, Enabled, 0, GPU-1f3a6c2e-8d0b-4c1e-9a57-2b8c4d6e0f11
1, NVIDIA H100 80GB HBM3, 81559, 30721, 550.54.15, Enabled, 2, GPU-7a9e0d44-51c3-4f8e-b2d6-93e1f0a8c725
2, NVIDIA GeForce RTX 4090, 24564, 512, 550.54.15, Disabled, [N/A], GPU-0c2d5b8f-66a1-4e0d-8f3b-7d4e9c1a2b30
"""
SMI_APPS = """\
GPU-7a9e0d44-51c3-4f8e-b2d6-93e1f0a8c725, 48213, 30702
GPU-7a9e0d44-51c3-4f8e-b2d6-93e1f0a8c725, 48290, 12
"""
PYTHON = sys.executable


def test_nvidia_smi_csv_gives_driver_devices_ecc_persistence_and_processes():
    gpu = remote_gpu.parse_smi_facts(SMI_GPUS, remote_gpu.parse_smi_apps(SMI_APPS))
    assert gpu["source"] == "nvidia-smi"
    assert gpu["driver"] == "550.54.15"
    first, second, third = gpu["devices"]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 4,
                     "ecc_uncorrected": 0, "persistence": True, "processes": []}
    assert second["ecc_uncorrected"] == 2
    assert second["processes"] == [{"pid": 48213, "used_mib": 30702}, {"pid": 48290, "used_mib": 12}]
    assert third["ecc_uncorrected"] is None and third["persistence"] is False


def test_nvidia_smi_lines_that_are_not_gpus_are_skipped():
    gpu = remote_gpu.parse_smi_facts("No devices were found\n", [])
    assert gpu["devices"] == [] and gpu["driver"] is None


Memory = namedtuple("Memory", "total free used")
Process = namedtuple("Process", "pid usedGpuMemory")


def fake_pynvml(ecc: dict[int, int | None], processes: dict[int, list[Process]]) -> types.ModuleType:
    """A module with nvidia-ml-py's names and call signatures; ecc None = not supported."""
    nv = types.ModuleType("pynvml")
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    nv.NVML_VOLATILE_ECC = 0
    nv.calls = []

    class NVMLError(Exception):
        pass

    def get_ecc(handle: int, error_type: int, counter_type: int) -> int:
        assert (error_type, counter_type) == (1, 0), "uncorrected, volatile"
        if ecc[handle] is None:
            raise NVMLError("Not Supported")
        return ecc[handle]

    nv.NVMLError = NVMLError
    nv.nvmlInit = lambda: nv.calls.append("init")
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlDeviceGetCount = lambda: len(ecc)
    nv.nvmlDeviceGetHandleByIndex = lambda index: index
    nv.nvmlDeviceGetName = lambda handle: b"NVIDIA A100-SXM4-40GB"  # older bindings return bytes
    nv.nvmlDeviceGetMemoryInfo = lambda handle: Memory(40 * 1024**3, 39 * 1024**3, 1024**3)
    nv.nvmlDeviceGetTotalEccErrors = get_ecc
    nv.nvmlDeviceGetComputeRunningProcesses = lambda handle: processes.get(handle, [])
    nv.nvmlDeviceGetPersistenceMode = lambda handle: 1 if handle == 0 else 0
    return nv


def test_nvml_facts_through_the_bindings_call_signatures():
    nv = fake_pynvml({0: 0, 1: None}, {1: [Process(4242, 2 * 1024**3), Process(4243, None)]})
    gpu = remote_gpu.nvml_facts(nv)
    assert gpu["source"] == "nvml" and gpu["driver"] == "550.54.15"
    first, second = gpu["devices"]
    assert first == {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960,
                     "memory_used_mib": 1024, "ecc_uncorrected": 0, "persistence": True, "processes": []}
    assert second["ecc_uncorrected"] is None and second["persistence"] is False
    assert second["processes"] == [{"pid": 4242, "used_mib": 2048}, {"pid": 4243, "used_mib": None}]
    assert nv.calls == ["init", "shutdown"]


def test_gpu_facts_fall_back_to_nvidia_smi_when_nvml_cannot_start(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in --query-gpu=*) cat {tmp_path}/gpus;; *) cat {tmp_path}/apps;; esac\n")
    smi.chmod(0o755)
    (tmp_path / "gpus").write_text(SMI_GPUS)
    (tmp_path / "apps").write_text(SMI_APPS)
    nv = fake_pynvml({0: 0}, {})

    def no_driver() -> None:
        raise nv.NVMLError("Driver Not Loaded")

    nv.nvmlInit = no_driver
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(probe, "gpu_count", lambda: 3)
    monkeypatch.setattr(probe, "load_pynvml", lambda inbox, emit: nv)
    gpu = probe.gpu_facts(probe.Inbox(io.BytesIO()), lambda kind, fields: None)
    assert gpu["source"] == "nvidia-smi" and len(gpu["devices"]) == 3


def test_a_host_without_gpus_reports_no_gpu():
    gpu = probe.gpu_facts(probe.Inbox(io.BytesIO()), lambda kind, fields: None)
    assert gpu == {"source": "none", "driver": None, "devices": []}


def test_a_host_without_pynvml_asks_the_controller_and_loads_what_it_sends(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails, as on a bare host
    reply = json.dumps({"module": "pynvml", "source": "SHIPPED = True\n"}).encode() + b"\n"
    asked: list[tuple[str, dict]] = []
    module = probe.load_pynvml(probe.Inbox(io.BytesIO(reply)), lambda kind, fields: asked.append((kind, fields)))
    assert asked == [("need", {"module": "pynvml"})]
    assert module.SHIPPED is True


def test_without_a_shipped_module_nvml_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reply = json.dumps({"module": "pynvml", "source": None}).encode() + b"\n"
    assert probe.load_pynvml(probe.Inbox(io.BytesIO(reply)), lambda kind, fields: None) is None


def test_torch_version_and_cuda_come_from_its_files_without_importing_it():
    code = ("import json, sys; from orchestrator.remote import probe; "
            "print(json.dumps([probe.torch_from_files(), 'torch' in sys.modules]))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout
    info, imported = json.loads(out)
    import torch

    assert imported is False
    assert info["version"] == torch.__version__ and info["cuda"] == torch.version.cuda
    assert info["imported"] is False


def test_interfaces_without_iproute2_come_from_ioctl():
    assert "127.0.0.1/8" in probe.interfaces_by_ioctl()["lo"]


# ---------------------------------------------------------------- the protocol, run for real


def local_transport(name: str = "here"):
    return transport_for(NodeSpec(name=name, host="localhost", python=PYTHON, transport=TransportKind.LOCAL))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fast_probe_has_no_full_facts():
    run = ProbeRun(local_transport(), {})
    run.start()
    facts = run.finish(30)
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "torch_info" not in facts and "gpu" not in facts and "listen" not in facts


def test_master_probe_listens_until_stopped_and_records_who_connected():
    port = free_port()
    run = ProbeRun(local_transport(), {"listen_seconds": 30, "port_exact": port})
    run.start()
    listening = run.wait_listening(30)
    assert listening is not None and listening["ok"] and listening["port"] == port
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    run.send({"stop": True})
    facts = run.finish(30)
    assert facts["listen"] == {"port": port, "ok": True, "error": None, "accepted": ["127.0.0.1"]}
    assert facts["port_exact_free"] is True
    assert probe.port_free(port), "the probe leaves the port free for torchrun"


def test_the_masters_listener_takes_every_host_of_a_large_job_at_once_while_it_drains_one() -> None:
    # 300 hosts connect at once while the accept thread drains one connection that stays open (up to
    # DRAIN_TIMEOUT): with a backlog of 128 the kernel dropped the handshakes past it, and those hosts'
    # connects timed out (CONNECT_TIMEOUT, 2 s): a false port-reachable error at 244 hosts.
    listener = probe.Listener(free_port())
    held = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    burst = [socket.socket() for _ in range(300)]
    try:
        for sock in burst:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", listener.port))
        _, pending, _ = select.select([], burst, [], 1.0)
        done = [s for s in pending if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
        assert len(done) == len(burst), f"{len(burst) - len(done)} of {len(burst)} handshakes not done within 1 s"
    finally:
        for sock in [held, *burst]:
            sock.close()
        listener.close()


def test_master_probe_reports_a_port_another_process_listens_on():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = ProbeRun(local_transport(), {"listen_seconds": 30, "port_exact": port})
        run.start()
        listening = run.wait_listening(30)
        run.send({"stop": True})
        facts = run.finish(30)
    assert listening is not None and listening["ok"] is False
    assert facts["port_exact_free"] is False
    assert facts["listen"]["ok"] is False and "in use" in facts["listen"]["error"]


def test_a_probe_told_later_connects_and_resolves_where_the_controller_says():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        run = ProbeRun(local_transport(), {"connect_later": True})
        run.start()
        run.send({"connect_to": ["127.0.0.1", port], "resolve": ["localhost", "no-such-host.invalid"]})
        facts = run.finish(30)
    assert facts["connect"]["ok"] is True and facts["connect"]["port"] == port
    assert "127.0.0.1" in facts["resolved"]["localhost"]["addrs"]
    assert facts["resolved"]["no-such-host.invalid"]["error"]


def test_a_refused_connection_is_reported_with_its_reason():
    port = free_port()
    result = probe.connect("127.0.0.1", port)
    assert result["ok"] is False and result["error"] == "connection refused"


def test_full_probe_reports_host_resources_and_a_clock(tmp_path):
    run = ProbeRun(local_transport(), {"full": True, "workdir": str(tmp_path / "missing")})
    run.start()
    facts = run.finish(60)
    assert facts["cpus"] >= 1 and facts["memory"]["total"] > 0
    assert facts["disk"]["exists"] is False and facts["disk"]["free"] > 0
    assert facts["shm"]["total"] > 0
    assert abs(facts["clock_skew"]) < 2
    assert facts["torch_info"]["version"]


def test_a_probe_that_cannot_start_python_names_the_interpreter():
    transport = transport_for(NodeSpec(name="here", host="localhost", python=str(Path("/nonexistent/python")),
                                       transport=TransportKind.LOCAL))
    run = ProbeRun(transport, {})
    with pytest.raises(InfraError, match="/nonexistent/python"):
        run.start()


def test_first_free_port_skips_a_port_something_listens_on() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        taken = held.getsockname()[1]
        found = probe.first_free_port(taken)
    assert found is not None and found > taken


STANDIN = "9.9.9+standin"


def standin_torch(where: Path) -> Path:
    """A torch package without version.py (as a source tree or a stand-in has it)."""
    (where / "torch").mkdir(parents=True)
    (where / "torch" / "__init__.py").write_text(f'__version__ = "{STANDIN}"\n')
    return where


def test_a_torch_without_version_py_reports_its_import_not_the_installed_metadata(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(standin_torch(tmp_path / "standin")))
    run = ProbeRun(local_transport(), {})
    run.start()
    assert run.finish(30)["torch"] == STANDIN


@pytest.mark.parametrize("where", ["pythonpath", "workdir"])
def test_import_from_finds_the_torch_the_jobs_pythonpath_or_workdir_holds(tmp_path, where):
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {"PYTHONPATH": str(standin_torch(tmp_path / "standin"))} if where == "pythonpath" else {}
    if where == "workdir":
        standin_torch(workdir)
    run = ProbeRun(local_transport(), {"full": True, "import_from": {"python": PYTHON, "cwd": str(workdir),
                                                                     "env": env}})
    run.start()
    facts = run.finish(60)
    assert facts["torch"] == facts["torch_info"]["version"] == STANDIN


def test_finding_the_jobs_sys_path_imports_nothing_planted_in_its_directory(tmp_path):
    workdir = tmp_path / "work"
    marker = tmp_path / "imported.txt"
    for name in ("json", "ast", "torch"):
        plant_module(workdir, name, marker)
    path = pyenv.job_sys_path(PYTHON, str(workdir), {})
    assert path is not None and path[0] == str(workdir)
    assert not marker.exists(), marker.read_text()


def test_the_jobs_sys_path_is_known_without_a_second_python_when_the_job_runs_the_probes_own(tmp_path):
    # Each host's probe started a second python for this (~30 ms of CPU per host, per launch).
    code = ("import json, subprocess, sys; from orchestrator.remote import pyenv; "
            f"asked = pyenv.job_sys_path(sys.executable, {str(tmp_path)!r}, {{'PYTHONNOUSERSITE': ''}}); "
            "subprocess.run = None; "
            f"known = pyenv.job_sys_path(sys.executable, {str(tmp_path)!r}, {{}}); "
            "print(json.dumps([asked, known]))")
    asked, known = json.loads(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert known == asked and known[0] == str(tmp_path)


def import_like(context: dict) -> list:
    code = ("import json, sys; from orchestrator.remote import probe; "
            f"probe.import_like_the_job({{'import_from': {context!r}}}); "
            "print(json.dumps([probe.torch_version(), 'torch' in sys.modules]))")
    return json.loads(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_the_installed_torch_is_read_from_its_files_and_not_imported_in_the_jobs_context(tmp_path):
    import torch

    assert import_like({"python": PYTHON, "cwd": str(tmp_path), "env": {}}) == [torch.__version__, False]


def test_a_torch_in_the_workdir_is_the_jobs_unless_safe_path_keeps_the_workdir_off_sys_path(tmp_path):
    import torch

    workdir = standin_torch(tmp_path / "work")
    assert import_like({"cwd": str(workdir), "env": {}}) == [STANDIN, True]
    assert import_like({"cwd": str(workdir), "env": {"PYTHONSAFEPATH": "1"}}) == [torch.__version__, False]


def job_workdir(where: Path) -> Path:
    """A workdir holding a script and a package whose import prints (the probe's output must not carry it)."""
    (where / "pkg").mkdir(parents=True)
    (where / "pkg" / "__init__.py").write_text("print('pkg imported')\n")
    (where / "pkg" / "train.py").write_text("raise SystemExit('the module ran')\n")
    (where / "app").mkdir()
    (where / "app" / "__init__.py").write_text("")
    (where / "app" / "__main__.py").write_text("raise SystemExit('the package ran')\n")
    (where / "train.py").write_text("raise SystemExit('the script ran')\n")
    return where


@pytest.mark.parametrize(("entry", "error"), [
    ({"module": "pkg.train"}, None),
    ({"module": "app"}, None),
    ({"module": "pkg.trian"}, "No module named 'pkg.trian'"),
    ({"module": "pgk.train"}, "ModuleNotFoundError: No module named 'pgk'"),
    ({"module": "pkg"}, "pkg is a package without a __main__ module"),
    ({"script": "train.py"}, None),
    ({"script": "trian.py"}, "no such file"),
    ({"script": "pkg"}, "not a file"),
])
def test_the_entry_is_looked_for_in_the_jobs_workdir_without_running_it(tmp_path, entry, error):
    workdir = job_workdir(tmp_path / "work")
    where = {"cwd": str(workdir)} if "script" in entry else {}
    run = ProbeRun(local_transport(), {"import_from": {"python": PYTHON, "cwd": str(workdir), "env": {}},
                                       "entry": {**entry, **where}})
    run.start()
    found = run.finish(30)["entry"]
    assert (found["kind"], found["name"]) == next(iter(entry.items()))
    assert (found["ok"], found["error"]) == (error is None, error)
    if error is None:
        assert Path(found["found"]).is_relative_to(workdir)


def test_a_script_entry_in_a_workdir_not_made_yet_says_so(tmp_path):
    found = probe.entry_facts({"script": "train.py"}, str(tmp_path / "missing"))
    assert found["error"] == f"no such file (the workdir {tmp_path / 'missing'} does not exist)"
