"""Train the guide's model on MNIST: `python examples/mnist/training.py [--num-epochs 2 ...]`."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

import ember
from ember import Config
from ember.data import DataLoaderBuilder
from ember.data.datasets import MnistDataset
from ember.optim import AdamConfig
from ember.record import CompactRecorder
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import MnistBatcher
from model import ModelConfig


class TrainingConfig(Config):
    model: ModelConfig = ModelConfig()
    optimizer: AdamConfig = AdamConfig()
    num_epochs: int = 10
    batch_size: int = 64
    num_workers: int = 4
    seed: int = 42
    learning_rate: float = 1.0e-4


def train(artifact_dir: str, config: TrainingConfig, device: str, limit: int | None = None) -> int:
    if ember.is_main_process():  # once, even when training on several devices
        shutil.rmtree(artifact_dir, ignore_errors=True)  # a fresh run each time
        Path(artifact_dir).mkdir(parents=True)
        config.save(f"{artifact_dir}/config.json")
    ember.seed(config.seed)

    train_set, test_set = MnistDataset.train(), MnistDataset.test()
    if limit is not None:  # a quick run on the first `limit` images of each set
        train_set = torch.utils.data.Subset(train_set, range(min(limit, len(train_set))))
        test_set = torch.utils.data.Subset(test_set, range(min(limit, len(test_set))))

    loader_train = (
        DataLoaderBuilder(MnistBatcher())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .num_workers(config.num_workers)
        .build(train_set)
    )
    loader_test = (
        DataLoaderBuilder(MnistBatcher())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .num_workers(config.num_workers)
        .build(test_set)
    )

    learner = (
        LearnerBuilder(artifact_dir)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(CompactRecorder())
        .devices([device])
        .num_epochs(config.num_epochs)
        .build(config.model.init(), config.optimizer.init(), config.learning_rate)
    )
    model = learner.fit(loader_train, loader_test)
    if ember.is_main_process():
        CompactRecorder().save(model, f"{artifact_dir}/model")
    return learner.exit_code  # 143 after SIGTERM: a job scheduler sees the preemption


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog=TrainingConfig().args_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--artifact-dir", default="artifacts/mnist")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N images")
    known, overrides = parser.parse_known_args(argv)
    config = TrainingConfig().with_args(overrides)
    return train(known.artifact_dir, config, known.device, known.limit)


if __name__ == "__main__":
    sys.exit(main())
