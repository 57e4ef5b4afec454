"""A torchrun worker whose ranks behave as real programs do: steps of one all_reduce each; one rank can
run a background logger thread (as TensorBoard or wandb do), one can serve something that is not a
Flight Recorder record on its socket (its own server in place of torch's), one can stop outside the
collective (in load_batch) while the others wait in it."""

from __future__ import annotations

import argparse
import http.server
import os
import socketserver
import threading
import time

import torch
import torch.distributed as dist

STUCK = 3600.0  # far past every test's bound: distrun stop, not this, ends a stuck rank


class Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every request with JSON of the wrong shape."""

    def do_POST(self) -> None:
        body = b'{"entries": [1, 2, 3]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_garbage() -> None:
    """Serve the wrong shape on this rank's socket, in place of torch's control plane."""
    path = os.path.join(os.environ["DISTRUN_WORKER_SOCKETS"], f"rank{os.environ['RANK']}.sock")
    os.unlink(path)
    server = UnixHTTPServer(path, Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def log_forever() -> None:
    """A background logger: it waits, and never enters a collective."""
    while True:
        time.sleep(0.5)


def load_batch(stuck: bool) -> torch.Tensor:
    if stuck:
        print(f"HANG START {time.time():.3f}", flush=True)
        time.sleep(STUCK)
    return torch.ones(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=30)
    parser.add_argument("--logger-rank", type=int, default=-1)
    parser.add_argument("--garbage-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == args.logger_rank:
        threading.Thread(target=log_forever, name="logger", daemon=True).start()
    if rank == args.garbage_rank:
        serve_garbage()
    for step in range(args.steps):
        dist.all_reduce(load_batch(rank == args.hang_rank and step == args.hang_step))
        print(f"step {step}", flush=True)
        time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
