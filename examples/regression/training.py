"""Multi-output regression on synthetic data, scored with ember's MAE, RMSE and R².

Run `python examples/regression/training.py [--artifact-dir DIR --num-epochs 30]`.

A small MLP learns two noisy non-linear functions of six features (1,000 samples, a
fixed seed, no download). Training and validation log `MaeMetric`, `RmseMetric` and
`R2Metric` from `ember.train.metric`: per iteration in the metric logs, and as exact
epoch values in `history.json` (the RMSE of an epoch is the root of its mean squared
error; R² is computed over the whole epoch, averaged over the two outputs as
scikit-learn's default). The last epoch's validation figures are printed and saved
to ARTIFACT_DIR/results.json.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.metric import LossMetric, MaeMetric, R2Metric, RmseMetric
from ember.train.renderer import PlainRenderer

METRICS = ("MAE", "RMSE", "R2")


@dataclass
class Batch:
    features: torch.Tensor  # [B, 6]
    targets: torch.Tensor  # [B, 2]


class Batcher:
    def batch(self, items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
        return Batch(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))


def make_data(size: int = 1000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Six features; two targets: a smooth non-linear one and a nearly linear one with
    a larger scale, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 6, generator=generator)
    first = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2]
    second = 3.0 * x[:, 3] - 2.0 * x[:, 4] + x[:, 5] ** 2
    y = torch.stack((first, second), dim=1)
    return x, y + 0.1 * torch.randn(size, 2, generator=generator)


class Regressor(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 2),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def regress(self, batch: Batch) -> RegressionOutput:
        predicted = self(batch.features)
        return RegressionOutput(F.mse_loss(predicted, batch.targets), predicted, batch.targets)

    def train_step(self, batch: Batch) -> TrainOutput:
        return TrainOutput(self.regress(batch))

    def valid_step(self, batch: Batch) -> RegressionOutput:
        return self.regress(batch)


def train(artifact_dir: str, num_epochs: int = 30, learning_rate: float = 3e-3) -> dict:
    ember.seed(0)
    x, y = make_data()
    items = list(zip(x, y))
    train_items, valid_items = items[:800], items[800:]
    builder = LearnerBuilder(artifact_dir, overwrite=True)
    for metric in (LossMetric(), MaeMetric(), RmseMetric(), R2Metric()):
        builder.metric_train_numeric(metric)
    for metric in (LossMetric(), MaeMetric(), RmseMetric(), R2Metric()):
        builder.metric_valid_numeric(metric)
    learner = (
        builder.renderer(PlainRenderer(interval=3600))
        .num_epochs(num_epochs)
        .build(Regressor(), AdamConfig().init(), learning_rate)
    )
    # 800 / 64 and 200 / 64 leave a last batch of 32 and of 8 samples.
    model = learner.fit(
        DataLoaderBuilder(Batcher()).batch_size(64).shuffle(1).build(train_items),
        DataLoaderBuilder(Batcher()).batch_size(64).build(valid_items),
    )
    epoch, values = learner.history[-1]
    results = {"epochs": epoch, **{name: values["valid"][name] for name in METRICS}}
    Path(artifact_dir, "results.json").write_text(json.dumps(results, indent=2))
    torch.save(model.state_dict(), Path(artifact_dir, "weights.pt"))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact-dir", default="artifacts/regression")
    parser.add_argument("--num-epochs", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    args = parser.parse_args(argv)
    results = train(args.artifact_dir, args.num_epochs, args.learning_rate)
    print(
        f"validation after {results['epochs']} epochs: MAE {results['MAE']:.4f}, "
        f"RMSE {results['RMSE']:.4f}, R2 {results['R2']:.4f}"
    )


if __name__ == "__main__":
    main()
