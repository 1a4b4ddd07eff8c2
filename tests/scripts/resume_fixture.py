"""The run behind `tests/fixtures/stopped-run/`: a run directory as ember 0.x wrote it,
stopped inside epoch 2, that today's code must resume exactly
(`tests/test_resume_fixture.py`).

    python tests/scripts/resume_fixture.py DIR [--straight]

Without `--straight` the run stops itself after iteration 13 of epoch 2 (a graceful
stop: a mid-epoch checkpoint); with it, it runs its 3 epochs through. Either way the
weights it ends with are written to DIR/final.mpk when it completes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, ProcessedItem
from ember.train.callbacks import EMA
from ember.train.metric import AccuracyMetric, GradNormMetric, LossMetric
from ember.train.renderer import PlainRenderer

STOP_AT = (2, 13)  # epoch, iteration


class StopAt:
    def __init__(self, interrupter) -> None:
        self.interrupter = interrupter

    def on_event(self, event) -> None:
        train = isinstance(event, ProcessedItem) and event.split == "train"
        if train and (event.epoch, event.iteration) == STOP_AT:
            self.interrupter.stop("the fixture stops here")


def run(directory: Path, *, stop: bool = False, resume: bool = False) -> LearnerBuilder:
    """Train (or resume) the fixture's run in `directory`; returns the learner."""
    torch.set_num_threads(1)
    ember.seed(5)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(3).build(BlobDataset(320))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1))
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(GradNormMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .with_file_checkpointer(DefaultRecorder())
        .checkpoint_every(steps=4)
        .valid_every(8)
        .callback(EMA(decay=0.9, validate_with_ema=True))
        .num_epochs(3)
        .renderer(PlainRenderer(interval=3600))
    )
    if resume:
        builder = builder.checkpoint("latest")
    if stop:
        builder = builder.listener(StopAt(builder.interrupter()))
    learner = builder.build(Classifier(), AdamConfig().init(), 1e-2)
    model = learner.fit(train, valid)
    if learner.outcome == "completed":
        DefaultRecorder().save(model, directory / "final")
    return learner


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--straight", action="store_true")
    args = parser.parse_args()
    learner = run(Path(args.dir), stop=not args.straight)
    print(learner.outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
