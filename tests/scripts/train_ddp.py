"""Training on several CPU processes (gloo), driven by tests in a subprocess.

Usage: python train_ddp.py DIR [--processes N] [--batch B] [--epochs E] [--fail-rank R]
Under torchrun, pass --processes 1: torchrun provides the processes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Linear(nn.Module):
    def __init__(self, fail_rank: int | None):
        super().__init__()
        self.layer = nn.Linear(8, 3)
        self.fail_rank, self.steps = fail_rank, 0

    def forward(self, x):
        return self.layer(x)

    def classify(self, batch):
        output = self(batch.inputs)
        return ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)

    def train_step(self, batch):
        self.steps += 1
        if (
            self.fail_rank is not None
            and self.steps == 3
            and int(os.environ.get("RANK", "0")) == self.fail_rank
        ):
            raise RuntimeError(f"deliberate failure on rank {self.fail_rank}")
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch):
        return self.classify(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    ember.seed(3)
    train = (
        DataLoaderBuilder(BlobBatcher()).batch_size(args.batch).shuffle(3).build(BlobDataset(203))
    )
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(args.batch).build(BlobDataset(61, seed=1))
    builder = LearnerBuilder(args.dir)
    if args.resume:
        builder = builder.checkpoint("latest")
    learner = (
        builder.metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices(["cpu"] * args.processes, timeout=args.timeout)
        .num_epochs(args.epochs)
        .renderer(PlainRenderer(interval=3600))
        .build(Linear(args.fail_rank), SgdConfig().init(), 0.5)
    )
    model = learner.fit(train, valid)
    if int(os.environ.get("RANK", "0")) == 0:
        DefaultRecorder().save(model, Path(args.dir) / "final")


if __name__ == "__main__":
    main()
