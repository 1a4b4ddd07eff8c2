"""A small training run driven by tests in a subprocess (kills, signals, resume).

Usage: python train_blobs.py DIR [--epochs N] [--resume] [--workers N] [--accumulation N]
       [--sleep SECONDS] [--ready FILE] [--valid-every N] [--ema] [--auto]
       [--preemption SIGNAL] [--requeue] [--requeue-log FILE] [--every-steps N]
       [--max-minutes M]
Writes the final weights to DIR/final.mpk when training completes; with --ema (an EMA
callback and the gradient norm metric), the EMA weights to DIR/ema.mpk.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.callbacks import EMA
from ember.train.metric import AccuracyMetric, GradNormMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Slow(Classifier):
    def __init__(self, sleep: float, ready: str | None):
        super().__init__()
        self.sleep, self.ready = sleep, ready

    def train_step(self, batch):
        if self.ready:
            Path(self.ready).touch()
        time.sleep(self.sleep)
        return super().train_step(batch)


def main(argv: list[str] | None = None) -> int:
    """The run; `argv` (the command line without the program) defaults to sys.argv."""
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--resume-or-start", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ready", default=None)
    parser.add_argument("--ema", action="store_true")
    parser.add_argument("--valid-every", type=int, default=None)
    parser.add_argument("--auto", action="store_true")
    parser.add_argument("--preemption", default=None)
    parser.add_argument("--requeue", action="store_true")
    parser.add_argument("--requeue-log", default=None)
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None)
    args = parser.parse_args(argv)

    # tiny ops: one thread is faster, and several runs of the script side by side do
    # not fight over the cores (the runs a test compares all take this path)
    torch.set_num_threads(1)
    ember.seed(9)
    train = (
        DataLoaderBuilder(BlobBatcher())
        .batch_size(16)
        .shuffle(9)
        .num_workers(args.workers)
        .build(BlobDataset(320))
    )
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1))

    def configured(builder: LearnerBuilder) -> LearnerBuilder:
        return (
            builder.metric_train_numeric(AccuracyMetric())
            .metric_train_numeric(LossMetric())
            .metric_valid_numeric(LossMetric())
            .with_file_checkpointer(DefaultRecorder())
            .grads_accumulation(args.accumulation)
            .num_epochs(args.epochs)
            .renderer(PlainRenderer(interval=3600))
        )

    builder = configured(LearnerBuilder(args.dir))
    if args.resume:
        builder = builder.checkpoint("latest")
    elif args.resume_or_start:
        from ember.record import DefaultRecorder as _Recorder
        from ember.train.checkpoint import FileCheckpointer

        if FileCheckpointer(Path(args.dir) / "checkpoint", _Recorder()).epochs():
            builder = builder.checkpoint("latest")
        else:
            builder = configured(LearnerBuilder(args.dir, overwrite=True))
    if args.auto:
        builder = builder.checkpoint("auto")
    if args.every_steps is not None:
        builder = builder.checkpoint_every(steps=args.every_steps)
    if args.max_minutes is not None:
        builder = builder.max_time(minutes=args.max_minutes)
    if args.preemption is not None:
        builder = builder.preemption(args.preemption, requeue=args.requeue)
    if args.requeue_log is not None:  # instead of scontrol: the job id is written down
        from ember.train.length import preemption

        log = Path(args.requeue_log)
        preemption.requeue_job = lambda job: log.write_text(job)
    ema = EMA(decay=0.9, validate_with_ema=True)
    if args.ema:
        builder = builder.callback(ema).metric_train_numeric(GradNormMetric())
    if args.valid_every is not None:
        builder = builder.valid_every(args.valid_every)
    learner = builder.build(Slow(args.sleep, args.ready), AdamConfig().init(), 1e-2)
    model = learner.fit(train, valid)
    if learner.outcome == "completed":
        DefaultRecorder().save(model, Path(args.dir) / "final")
        if args.ema:
            DefaultRecorder().save(ema.copy_to(copy.deepcopy(model)), Path(args.dir) / "ema")
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
