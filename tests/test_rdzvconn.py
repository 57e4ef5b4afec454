"""A host's connection to the rendezvous, read from /proc (remote/rdzvconn.py), and the sampler's `rdzv` field."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from orchestrator.remote import rdzvconn, sampler


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize(("argv", "found"), [
    (["python", "-m", "torch.distributed.run", "--node-rank", "1", "--master-addr", "10.0.0.1",
      "--master-port", "29500", "train.py"], ("10.0.0.1", 29500)),
    (["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29511", "--rdzv-id", "j"], ("node0", 29511)),
    (["torchrun", "--rdzv-endpoint", "[fd00::1]:29500"], ("fd00::1", 29500)),
    (["torchrun", "--standalone", "train.py"], None),
])
def test_the_endpoint_is_read_from_either_rendezvous_backends_argv(argv, found) -> None:
    assert rdzvconn.endpoint(argv) == found


def test_a_connected_socket_of_the_process_is_established_and_another_address_is_none(listener) -> None:
    addr, port = listener.getsockname()
    client = socket.create_connection((addr, port))
    try:
        assert rdzvconn.connection(rdzvconn.proc_address(addr, port), [os.getpid()]) == "established"
        assert rdzvconn.connection(rdzvconn.proc_address(addr, port + 1), [os.getpid()]) == "none"
    finally:
        client.close()


def test_another_processs_socket_to_the_endpoint_is_not_the_jobs(listener) -> None:
    addr, port = listener.getsockname()
    other = subprocess.Popen([sys.executable, "-c", f"import socket,time; s=socket.create_connection(('{addr}',"
                              f" {port})); print(1, flush=True); time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline()
        remote = rdzvconn.proc_address(addr, port)
        assert rdzvconn.connection(remote, [os.getpid()]) == "none"
        assert rdzvconn.connection(remote, [other.pid]) == "established"
    finally:
        other.kill()
        other.wait()


def test_the_sampler_tells_the_connection_until_the_job_has_workers(listener) -> None:
    addr, port = listener.getsockname()
    job_id = f"rdzv-{uuid.uuid4().hex[:8]}"
    code = f"import socket,time; s=socket.create_connection(('{addr}', {port})); print(1, flush=True); time.sleep(30)"
    torchrun = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                env={**os.environ, "DISTRUN_JOB_ID": job_id})
    worker = None
    try:
        assert torchrun.stdout is not None and torchrun.stdout.readline()
        host = sampler.HostSampler(job_id, 1.0, rdzv=(addr, port))
        sample, pids = host.sample()
        assert (pids, sample["rdzv"]) == ([torchrun.pid], "established")
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                  env={**os.environ, "DISTRUN_JOB_ID": job_id})
        time.sleep(0.2)
        host.job.samples = 0  # rediscovered now: the worker joins the job's processes
        sample, pids = host.sample()
        assert len(pids) == 2 and "rdzv" not in sample
        worker.kill()
        worker.wait()
        assert "rdzv" not in host.sample()[0], "once past the rendezvous, never read again"
    finally:
        for proc in (torchrun, worker):
            if proc is not None:
                proc.kill()
                proc.wait()
