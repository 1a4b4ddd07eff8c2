"""A run whose cosine schedule counts its own steps ("auto"), on 1 or more processes.

Usage: python train_schedule.py DIR [--processes N] [--accumulation A] [--epochs E]
Prints one JSON line on rank 0: the learner's step counts and the rate of every
optimizer step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.optim import SgdConfig
from ember.train import LearnerBuilder, ProcessedItem
from ember.train.renderer import PlainRenderer


class Rates:
    """Keeps the learning rate of every training iteration of this process."""

    def __init__(self, accumulation: int) -> None:
        self.accumulation = accumulation
        self.rates: list[float] = []

    def on_event(self, event):
        # The batches of one optimizer step share its rate: keep the first batch's.
        train = isinstance(event, ProcessedItem) and event.split == "train"
        if train and (event.iteration - 1) % self.accumulation == 0:
            self.rates.append(event.lr)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    ember.seed(0)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(1).build(BlobDataset(200))
    rates = Rates(args.accumulation)
    schedule = CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters="auto", min_lr=0.01)
    learner = (
        LearnerBuilder(args.dir, overwrite=True)
        .devices(["cpu"] * args.processes)
        .grads_accumulation(args.accumulation)
        .num_epochs(args.epochs)
        .listener(rates)
        .renderer(PlainRenderer(interval=3600))
        .build(Classifier(), SgdConfig(), schedule)
    )
    before = learner.steps(train)
    learner.fit(train)
    if ember.is_main_process():
        print(
            json.dumps(
                {
                    "before_fit": list(before),
                    "steps_per_epoch": learner.steps_per_epoch,
                    "total_steps": learner.total_steps,
                    "rates": rates.rates,
                }
            )
        )
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
