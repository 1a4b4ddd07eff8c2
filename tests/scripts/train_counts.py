"""One run trained, stopped and resumed on any number of CPU processes (gloo), driven by
tests in a subprocess: the same steps whatever the number of processes.

Usage: python train_counts.py DIR [--processes N] [--strategy ddp|fsdp|hsdp]
    [--shard-size N] [--sharded-checkpoints] [--batch B] [--accumulate K]
    [--global-batch G] [--dropout P] [--workers W] [--loader builder|plain]
    [--steps S] [--resume] [--epochs E] [--order FILE --per-step A]

The model (two hidden blocks, dropout --dropout after each) learns 8-dimensional blobs
(--samples, 301 by default) with Adam. --steps S ends the run after S optimizer steps
(its checkpoint is inside an epoch); --resume goes on from the latest checkpoint to the
end of --epochs. --loader plain reads the data with a shuffled torch DataLoader instead
of DataLoaderBuilder. --order FILE appends, for every training batch, a line
"epoch step rank i,j,..." with the indices of its samples as the collate function saw
them (workers 0), the step counted from the batch's iteration with --per-step batches
per step on each process.
Rank 0 saves the final weights in DIR/final.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
import torch.nn.functional as F
from ember_testing import BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Indexed(torch.utils.data.Dataset):
    """Blobs whose items carry their index."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.blobs = BlobDataset(size, seed=seed)

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int):
        x, y = self.blobs[index]
        return x, y, index


def collate(items):
    return (
        torch.stack([x for x, _, _ in items]),
        torch.tensor([y for _, y, _ in items]),
        torch.tensor([i for _, _, i in items]),
    )


class Block(nn.Module):
    def __init__(self, inputs: int, outputs: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, outputs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(torch.tanh(self.linear(x)))


class Net(nn.Module):
    def __init__(self, dropout: float, order: str | None) -> None:
        super().__init__()
        self.layer = nn.Sequential(Block(8, 16, dropout), Block(16, 16, dropout), nn.Linear(16, 3))
        self.order = order
        self.epoch = 0

    def forward(self, x):
        return self.layer(x)

    def classify(self, batch):
        x, y, _ = batch
        logits = self(x)
        return ClassificationOutput(F.cross_entropy(logits, y), logits, y)

    def train_step(self, batch):
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch):
        return self.classify(batch)


class Order:
    """Notes each training batch's sample indices (a listener)."""

    def __init__(self, path: str, per_step: int) -> None:
        self.path, self.per_step = path, per_step

    def on_event(self, event) -> None:
        from ember.train import ProcessedItem

        if isinstance(event, ProcessedItem) and event.split == "train":
            rank = os.environ.get("RANK", "0")
            indices = ",".join(map(str, NOTED.pop(0)))
            step = (event.iteration - 1) // self.per_step + 1
            with open(self.path, "a") as handle:
                handle.write(f"{event.epoch} {step} {rank} {indices}\n")


NOTED: list[list[int]] = []
"""The indices of each batch collated in this process, in order (workers 0)."""


def noting(items):
    batch = collate(items)
    NOTED.append(batch[2].tolist())
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--shard-size", type=int, default=None)
    parser.add_argument("--sharded-checkpoints", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=None)
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--loader", default="builder", choices=["builder", "plain"])
    parser.add_argument("--samples", type=int, default=301)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--order", default=None)
    parser.add_argument("--per-step", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(1)
    ember.seed(3)
    train_set, valid_set = Indexed(args.samples), Indexed(61, seed=1)
    batcher = noting if args.order and args.workers == 0 else collate
    if args.loader == "plain":
        generator = torch.Generator().manual_seed(5)
        train = torch.utils.data.DataLoader(
            train_set,
            batch_size=args.batch,
            shuffle=True,
            generator=generator,
            collate_fn=batcher,
            num_workers=args.workers,
        )
    else:
        train = (
            DataLoaderBuilder(batcher)
            .batch_size(args.batch)
            .shuffle(3)
            .num_workers(args.workers)
            .build(train_set)
        )
    valid = DataLoaderBuilder(collate).batch_size(16).build(valid_set)
    strategy = {}
    if args.strategy in ("fsdp", "hsdp"):
        strategy = {"strategy": args.strategy, "modules": [Block]}
        if args.shard_size is not None:
            strategy["shard_size"] = args.shard_size
        if args.sharded_checkpoints:
            strategy["sharded_checkpoints"] = True
    builder = (
        LearnerBuilder(args.dir)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices(["cpu"] * args.processes, timeout=120, **strategy)
        .num_epochs(args.epochs)
        .renderer(PlainRenderer(interval=3600))
    )
    if args.accumulate is not None:
        builder = builder.grads_accumulation(args.accumulate)
    if args.global_batch is not None:
        builder = builder.global_batch(args.global_batch)
    if args.resume:
        builder = builder.checkpoint("latest")
    if args.steps is not None:
        builder = builder.train_for(f"{args.steps} steps")
    if args.order and args.workers == 0:
        builder = builder.listener(Order(args.order, args.per_step))
    learner = builder.build(Net(args.dropout, args.order), AdamConfig().init(), 0.01)
    learner.fit(train, valid)
    state = learner.model_state_dict()  # gathered on rank 0 under FSDP
    if int(os.environ.get("RANK", "0")) == 0 and learner.outcome == "completed":
        DefaultRecorder().save(state, Path(args.dir) / "final", kind="module")
    sys.exit(learner.exit_code)


if __name__ == "__main__":
    main()
