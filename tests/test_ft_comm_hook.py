"""The bundled ResNet script's torchft comm hook (`--strategy ft-ddp`) when a peer group dies
mid-allreduce: torchft 0.2.0's own hook fails an assertion there (a surviving group crashed with
it in a local run), the script's hands DDP the bucket as it is and leaves the error to the manager,
which then does not commit the step.

The manager is a stand-in with the two members `_ManagedWork` uses (`_logger`, `report_error`);
the work, its failure and the hooks are torchft's and torch's own."""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from types import ModuleType

import pytest
import torch
import torch.distributed as dist

from tests.helpers import REPO

pytest.importorskip("torchft")
from torchft.ddp import DistributedDataParallel as TorchftDDP
from torchft.manager import _ManagedWork


class PeerDied(dist._Work):
    """A gloo allreduce whose peer went away: its wait raises as gloo's does."""

    def wait(self, timeout: object = None) -> bool:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:59088")


class Done(dist._Work):
    """An allreduce that completed: its future holds the (already reduced) tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self.fut.set_result(tensor)

    def wait(self, timeout: object = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[torch.Tensor]:
        return self.fut


class Manager:
    """What `_ManagedWork` asks of torchft's Manager, and an `allreduce` that returns `work(tensor)`."""

    def __init__(self, work: type[dist._Work]) -> None:
        self.work = work
        self.made: list[dist._Work] = []
        self.errors: list[Exception] = []
        self._logger = logging.getLogger("test-manager")

    def report_error(self, error: Exception) -> None:
        self.errors.append(error)

    def allreduce(self, tensor: torch.Tensor) -> _ManagedWork:
        self.made.append(self.work(tensor) if self.work is Done else self.work())
        return _ManagedWork(self, self.made[-1], tensor)


class Bucket:
    def __init__(self, values: list[float]) -> None:
        self.values = torch.tensor(values)

    def buffer(self) -> torch.Tensor:
        return self.values


@functools.cache
def script() -> ModuleType:
    """jobs/train_resnet50.py as a module (its dataclasses need it in sys.modules)."""
    sys.path.insert(0, str(REPO / "jobs"))  # its own imports: quick_exit, resnet_model
    try:
        spec = importlib.util.spec_from_file_location("train_resnet50_hook", REPO / "jobs" / "train_resnet50.py")
        assert spec is not None and spec.loader is not None
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "jobs"))


def test_torchfts_own_hook_fails_an_assertion_when_a_peer_died_in_the_allreduce() -> None:
    manager = Manager(PeerDied)
    with pytest.raises(AssertionError):
        TorchftDDP._comm_hook(manager, Bucket([1.0, 2.0]))
    assert len(manager.errors) == 1, "the manager had the error before the assertion"


def test_the_scripts_hook_hands_the_bucket_back_and_leaves_the_error_to_the_manager() -> None:
    manager = Manager(PeerDied)
    bucket = Bucket([1.0, 2.0])
    fut = script().ft_comm_hook(manager, bucket)
    assert fut.wait() is bucket.values and fut.wait().tolist() == [1.0, 2.0]
    assert [str(e) for e in manager.errors] == [
        "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:59088"]


def test_the_scripts_hook_returns_torchfts_chained_future_when_the_allreduce_succeeds() -> None:
    manager = Manager(Done)
    fut = script().ft_comm_hook(manager, Bucket([3.0, 4.0]))
    assert fut is manager.made[0].get_future() and fut.wait().tolist() == [3.0, 4.0] and not manager.errors
