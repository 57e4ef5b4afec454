"""A training program written the way third-party examples are, and nothing for distrun: its own
Trainer class, a snapshot file it resumes from, DDP over gloo on CPU with a DistributedSampler, and
one line per epoch from rank 0 ("Epoch N | loss X | steps K"). No metrics lines, no control plane,
no distrun variable is read: what distrun learns of it, it learns from outside."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    """Trains a small model for some epochs; rank 0 keeps a snapshot every `save_every` epochs."""

    def __init__(self, model: torch.nn.Module, data: DataLoader, save_every: int, snapshot_path: str) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.data = data
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            self._load_snapshot()
        self.model = DistributedDataParallel(self.model)

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot_path, weights_only=True)
        self.model.load_state_dict(snapshot["model"])
        self.epochs_run = snapshot["epochs_run"]
        if self.rank == 0:
            print(f"Resuming from the snapshot at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"model": self.model.module.state_dict(), "epochs_run": epoch + 1}
        torch.save(snapshot, self.snapshot_path + ".tmp")
        os.replace(self.snapshot_path + ".tmp", self.snapshot_path)

    def _run_batch(self, source: torch.Tensor, target: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(source), target)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        sampler = self.data.sampler
        assert isinstance(sampler, DistributedSampler)
        sampler.set_epoch(epoch)
        loss = 0.0
        for source, target in self.data:
            loss = self._run_batch(source, target)
        if self.rank == 0:
            print(f"Epoch {epoch} | loss {loss:.4f} | steps {len(self.data)}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description="a small distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--snapshot_path", default="snapshot.pt")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(args.samples, 256), torch.randn(args.samples, 1))
    data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    Trainer(model, data, args.save_every, args.snapshot_path).train(args.total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
