"""Regression on scikit-learn's diabetes data.

Run `python examples/diabetes/training.py [--num-epochs 50 --learning-rate 1e-3 ...]`.

442 patients, 10 baseline measurements each (age, sex, BMI, blood pressure, six blood
serum values); the target is a measure of disease progression one year later. A small
MLP learns it from standardised features and targets. The run uses a cosine
learning-rate schedule, stops early when the validation loss stops improving, and
hands back the weights of its best epoch. The figures that matter are printed and
saved to ARTIFACT_DIR/results.json: the validation RMSE in the target's own units,
next to the RMSE of always predicting the training mean.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_diabetes
from torch import nn

import ember
from ember import Config
from ember.data import DataLoaderBuilder
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.optim import AdamWConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, MetricEarlyStoppingStrategy, RegressionOutput, TrainOutput
from ember.train.metric import (
    LearningRateMetric,
    LossMetric,
    MetricMetadata,
    MetricValue,
    RegressionInput,
)

# The model ---------------------------------------------------------------------------


class ModelConfig(Config):
    num_features: int = 10
    hidden_size: int = 32
    dropout: float = 0.1

    def init(self) -> Regressor:
        return Regressor(self)


@dataclass
class DiabetesBatch:
    features: torch.Tensor  # [B, 10], standardised
    targets: torch.Tensor  # [B], standardised


class Regressor(nn.Module):
    """Two hidden layers; predicts the standardised target."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(config.num_features, config.hidden_size),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def regress(self, batch: DiabetesBatch) -> RegressionOutput:
        predicted = self(batch.features)
        return RegressionOutput(F.mse_loss(predicted, batch.targets), predicted, batch.targets)

    def train_step(self, batch: DiabetesBatch) -> TrainOutput:
        return TrainOutput(self.regress(batch))

    def valid_step(self, batch: DiabetesBatch) -> RegressionOutput:
        return self.regress(batch)


# Metrics in the target's own units -----------------------------------------------------


class RmseMetric:
    """Root-mean-square error in target units (`scale` = the target's standard deviation).

    The iteration value is the batch RMSE; the epoch value is the RMSE of the whole
    epoch, sqrt(total squared error / count), which a mean of batch RMSEs is not.
    """

    name = "RMSE"
    unit = ""
    higher_is_better = False
    input_type = RegressionInput

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.clear()

    def update(self, input: RegressionInput, meta: MetricMetadata) -> MetricValue:
        squared = (input.output - input.targets).pow(2).sum()
        count = input.targets.numel()
        self._squared = self._squared + squared.double()
        self._count += count
        return MetricValue((squared / count).sqrt(), count, scale=self.scale)

    def epoch_value(self) -> torch.Tensor | float:
        if not self._count:
            return math.nan
        return (self._squared / self._count).sqrt() * self.scale

    def clear(self) -> None:
        self._squared: torch.Tensor | float = 0.0
        self._count = 0


class MaeMetric:
    """Mean absolute error in target units: a plain mean over samples, so the epoch
    value is the weighted mean of the batch values and needs no `epoch_value`."""

    name = "MAE"
    unit = ""
    higher_is_better = False
    input_type = RegressionInput

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def update(self, input: RegressionInput, meta: MetricMetadata) -> MetricValue:
        error = (input.output - input.targets).abs().mean()
        return MetricValue(error, input.targets.numel(), scale=self.scale)

    def clear(self) -> None:
        pass


# Data --------------------------------------------------------------------------------


class DiabetesBatcher:
    def batch(self, items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DiabetesBatch:
        return DiabetesBatch(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))


@dataclass
class Splits:
    """Standardised train and validation items, and how to undo the target scaling."""

    train: list[tuple[torch.Tensor, torch.Tensor]]
    valid: list[tuple[torch.Tensor, torch.Tensor]]
    target_mean: float
    target_std: float
    train_targets: np.ndarray  # original units
    valid_targets: np.ndarray


def load_splits(valid_fraction: float, seed: int) -> Splits:
    """Split the 442 patients by a seeded permutation; standardise with training statistics."""
    features, targets = load_diabetes(return_X_y=True, scaled=False)
    order = np.random.default_rng(seed).permutation(len(targets))
    n_valid = round(len(targets) * valid_fraction)
    valid_index, train_index = order[:n_valid], order[n_valid:]
    mean, std = features[train_index].mean(axis=0), features[train_index].std(axis=0)
    target_mean, target_std = targets[train_index].mean(), targets[train_index].std()
    x = torch.tensor((features - mean) / std, dtype=torch.float32)
    y = torch.tensor((targets - target_mean) / target_std, dtype=torch.float32)
    return Splits(
        train=[(x[i], y[i]) for i in train_index],
        valid=[(x[i], y[i]) for i in valid_index],
        target_mean=float(target_mean),
        target_std=float(target_std),
        train_targets=targets[train_index],
        valid_targets=targets[valid_index],
    )


# Training ----------------------------------------------------------------------------


class TrainingConfig(Config):
    model: ModelConfig = ModelConfig()
    optimizer: AdamWConfig = AdamWConfig(weight_decay=1e-2)
    num_epochs: int = 300
    batch_size: int = 32
    learning_rate: float = 3e-3
    min_learning_rate: float = 1e-5
    patience: int = 25
    valid_fraction: float = 0.2
    seed: int = 42
    num_threads: int = 1  # a model this small runs fastest on one CPU thread


def train(
    artifact_dir: str, config: TrainingConfig, device: str = "cpu"
) -> dict[str, float | int | str]:
    started = time.perf_counter()
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    config.save(f"{artifact_dir}/config.json")
    torch.set_num_threads(config.num_threads)
    ember.seed(config.seed)

    data = load_splits(config.valid_fraction, config.seed)
    loader_train = (
        DataLoaderBuilder(DiabetesBatcher())
        .batch_size(config.batch_size)
        .shuffle(config.seed)
        .build(data.train)
    )
    loader_valid = (
        DataLoaderBuilder(DiabetesBatcher()).batch_size(config.batch_size).build(data.valid)
    )

    schedule = CosineAnnealingLrSchedulerConfig(  # "auto": anneal over the run's optimizer steps
        initial_lr=config.learning_rate,
        num_iters="auto",
        min_lr=min(config.min_learning_rate, config.learning_rate),
    )
    learner = (
        LearnerBuilder(artifact_dir, overwrite=True)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_train_numeric(RmseMetric(data.target_std))
        .metric_valid_numeric(RmseMetric(data.target_std))
        .metric_valid_numeric(MaeMetric(data.target_std))
        .metric_train(LearningRateMetric())
        # Keeps the last 2 epochs and the best by valid Loss, which restore_best reloads.
        .with_file_checkpointer(DefaultRecorder())
        .early_stopping(
            MetricEarlyStoppingStrategy(LossMetric(), no_improvement_since=config.patience)
        )
        .devices([device])
        .num_epochs(config.num_epochs)
        .build(config.model.init(), config.optimizer.init(), schedule)
    )
    model = learner.fit(loader_train, loader_valid, restore_best=True)
    DefaultRecorder().save(model, f"{artifact_dir}/model")

    # Evaluate the restored (best) model on the validation split, in the target's units.
    model.eval()
    features = torch.stack([x for x, _ in data.valid]).to(device)
    with torch.inference_mode():
        predicted = model(features).double().cpu().numpy() * data.target_std + data.target_mean
    truth = data.valid_targets
    baseline = np.full_like(truth, data.train_targets.mean())
    mse = float(np.mean((predicted - truth) ** 2))
    baseline_mse = float(np.mean((baseline - truth) ** 2))
    best_epoch = min(learner.history, key=lambda entry: entry[1]["valid"]["Loss"])[0]
    results: dict[str, float | int | str] = {
        "valid_mse": mse,
        "valid_rmse": math.sqrt(mse),
        "valid_mae": float(np.mean(np.abs(predicted - truth))),
        "valid_r2": 1.0 - mse / float(np.var(truth)),
        "baseline_mse": baseline_mse,
        "baseline_rmse": math.sqrt(baseline_mse),
        "best_epoch": best_epoch,
        "epochs_run": len(learner.history),
        "outcome": learner.outcome or "",
        "train_samples": len(data.train),
        "valid_samples": len(data.valid),
        "seconds": round(time.perf_counter() - started, 2),
    }
    text = json.dumps(results, indent=2) + "\n"
    Path(f"{artifact_dir}/results.json").write_text(text, encoding="utf-8")
    print(
        f"validation RMSE {results['valid_rmse']:.2f} "
        f"(MSE {mse:.1f}, R² {results['valid_r2']:.3f}) "
        f"vs {results['baseline_rmse']:.2f} for the mean predictor (MSE {baseline_mse:.1f}); "
        f"best epoch {best_epoch} of {results['epochs_run']}, {results['seconds']} s"
    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=TrainingConfig().args_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--artifact-dir", default="artifacts/diabetes")
    parser.add_argument("--device", default="cpu")
    known, overrides = parser.parse_known_args(argv)
    config = TrainingConfig().with_args(overrides)
    train(known.artifact_dir, config, known.device)


if __name__ == "__main__":
    main()
