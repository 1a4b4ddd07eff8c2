"""A small training run with the CSV, TensorBoard and MLflow loggers, driven by tests in
a subprocess (kills, graceful stops, resume, several processes).

Usage: python train_loggers.py DIR [--epochs N] [--resume latest|N] [--processes N]
       [--batch B] [--sleep SECONDS] [--pause-at STEP --pause SECONDS]
Writes DIR/metrics.csv, DIR/tensorboard/ and an MLflow file store in DIR/mlruns (the
run id in DIR/mlflow_run_id, so that a resumed run attaches to the same MLflow run).
Each train_step sleeps --sleep seconds; the --pause-at STEP-th call touches DIR/paused,
then sleeps --pause seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.logger import CsvMetricLogger, MlflowMetricLogger, TensorBoardMetricLogger
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Pausing(Classifier):
    def __init__(self, sleep: float, pause_at: int | None, pause: float, directory: Path):
        super().__init__(dropout=0.0)  # several processes compute what one would
        self.sleep, self.pause_at, self.pause = sleep, pause_at, pause
        self.directory, self.calls = directory, 0

    def train_step(self, batch):
        self.calls += 1
        time.sleep(self.sleep)
        if self.calls == self.pause_at:
            (self.directory / "paused").touch()
            time.sleep(self.pause)
        return super().train_step(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    ember.seed(9)
    train = (
        DataLoaderBuilder(BlobBatcher()).batch_size(args.batch).shuffle(9).build(BlobDataset(320))
    )
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(args.batch).build(BlobDataset(64, seed=1))
    builder = LearnerBuilder(directory / "run")
    if args.resume is not None:
        builder = builder.checkpoint(args.resume if args.resume == "latest" else int(args.resume))
    loggers: list = []
    if int(os.environ.get("RANK", "0")) == 0:  # the loggers live on rank 0
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        run_file = directory / "mlflow_run_id"
        tracking = MlflowMetricLogger(
            (directory / "mlruns").as_uri(),
            experiment_name="loggers",
            run_id=run_file.read_text() if args.resume is not None else None,
            interval=0.0,
        )
        run_file.write_text(tracking.run_id)
        loggers = [
            CsvMetricLogger(directory / "metrics.csv"),
            TensorBoardMetricLogger(directory / "tensorboard"),
            tracking,
        ]
    learner = (
        builder.metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_loggers(train=loggers, valid=loggers)
        .with_file_checkpointer(DefaultRecorder())
        .devices(["cpu"] * args.processes)
        .num_epochs(args.epochs)
        .renderer(PlainRenderer(interval=3600))
        .build(Pausing(args.sleep, args.pause_at, args.pause, directory), AdamConfig().init(), 1e-2)
    )
    learner.fit(train, valid)


if __name__ == "__main__":
    main()
