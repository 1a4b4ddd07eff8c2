"""A small convolutional network on MNIST, trained with Adadelta and a per-epoch StepLR.

Run `python examples/ported/mnist_cnn.py [--num-epochs 14 --limit 6000 ...]`.

The classic recipe: two 3x3 convolutions, max pooling, dropout and two linear layers
ending in log-probabilities, trained with the negative log-likelihood; Adadelta at
a rate of 1.0, multiplied by 0.7 after every epoch (`StepLR(step_size=1, gamma=0.7)`,
which ember steps once per epoch when given as `(scheduler, "epoch")`). Accuracy and
loss are reported on the training images and on the 10,000 test images.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import Config
from ember.data import DataLoaderBuilder
from ember.data.datasets import MnistDataset
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LearningRateMetric, LossMetric

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


class TrainingConfig(Config):
    batch_size: int = 64
    test_batch_size: int = 1000
    num_epochs: int = 14
    learning_rate: float = 1.0
    gamma: float = 0.7  # the rate's factor after each epoch
    seed: int = 1
    limit: int | None = None  # use only the first `limit` images of each set
    num_workers: int = 0


@dataclass
class MnistBatch:
    images: torch.Tensor  # [B, 1, 28, 28], standardised
    targets: torch.Tensor  # [B] class indices


class MnistBatcher:
    """Stacks (image, label) items: pixels scaled to [0, 1], then standardised."""

    def batch(self, items: Sequence[tuple[np.ndarray, int]]) -> MnistBatch:
        images = torch.from_numpy(np.stack([image for image, _ in items])).unsqueeze(1)
        images = (images.float() / 255.0 - MNIST_MEAN) / MNIST_STD
        return MnistBatch(images, torch.tensor([label for _, label in items], dtype=torch.int64))


class Net(nn.Module):
    """conv 32, conv 64, max pool, dropout, linear 128, dropout, linear 10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 1, 28, 28] -> log-probabilities [B, 10]."""
        x = F.relu(self.conv1(images))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)

    def classify(self, batch: MnistBatch) -> ClassificationOutput:
        output = self(batch.images)
        return ClassificationOutput(F.nll_loss(output, batch.targets), output, batch.targets)

    def train_step(self, batch: MnistBatch) -> TrainOutput[ClassificationOutput]:
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: MnistBatch) -> ClassificationOutput:
        return self.classify(batch)


def loaders(config: TrainingConfig) -> tuple[Any, Any]:
    """Training images shuffled every epoch (in an order fixed by the seed and the
    epoch), test images in order."""
    train_set, test_set = MnistDataset.train(), MnistDataset.test()
    if config.limit is not None:
        train_set = torch.utils.data.Subset(train_set, range(min(config.limit, len(train_set))))
        test_set = torch.utils.data.Subset(test_set, range(min(config.limit, len(test_set))))
    train_loader = (
        DataLoaderBuilder(MnistBatcher())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .num_workers(config.num_workers)
        .build(train_set)
    )
    test_loader = (
        DataLoaderBuilder(MnistBatcher())
        .batch_size(config.test_batch_size)
        .num_workers(config.num_workers)
        .build(test_set)
    )
    return train_loader, test_loader


def train(
    artifact_dir: str,
    config: TrainingConfig,
    device: str = "cpu",
    *,
    configure: Callable[[LearnerBuilder], LearnerBuilder] | None = None,
) -> tuple[Net, Any]:
    """Train and return `(model, learner)`; `configure` may add options to the
    `LearnerBuilder` (listeners, loggers) before the learner is built."""
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    config.save(f"{artifact_dir}/config.json")
    ember.seed(config.seed)
    train_loader, test_loader = loaders(config)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=config.learning_rate)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=config.gamma)
    builder = (
        LearnerBuilder(artifact_dir, overwrite=True)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_train(LearningRateMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices([device])
        .num_epochs(config.num_epochs)
    )
    if configure is not None:
        builder = configure(builder)
    learner = builder.build(model, optimizer, (scheduler, "epoch"))  # StepLR once per epoch
    model = learner.fit(train_loader, test_loader)
    return model, learner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=TrainingConfig().args_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--artifact-dir", default="artifacts/mnist-cnn")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    known, overrides = parser.parse_known_args(argv)
    config = TrainingConfig().with_args(overrides)
    model, learner = train(known.artifact_dir, config, known.device)
    DefaultRecorder().save(model, f"{known.artifact_dir}/model")
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
