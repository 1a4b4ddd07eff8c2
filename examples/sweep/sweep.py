"""A hyperparameter search with Optuna over ember runs: scikit-learn's digits.

Run `python examples/sweep/sweep.py [--trials 20 --epochs 10 --storage sqlite:///sweep.db]`.

1797 handwritten digits of 8x8 pixels (bundled with scikit-learn: nothing is
downloaded). Each trial trains a one-hidden-layer MLP for a learning rate and a width
that Optuna suggests, in its own artifact directory `ROOT/trial-N`; the trial reports
its validation loss at each epoch end and the study's median pruner stops the trials
that fall behind (their runs end "pruned", with a checkpoint). The study is stored in
SQLite (any database URL Optuna takes works: PostgreSQL, MySQL), so a search can be
stopped and continued, and `ember compare ROOT/trial-*` compares the trials' runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import optuna
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.integrations.optuna import OptunaPruning
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))

    def classify(self, batch: tuple[torch.Tensor, torch.Tensor]) -> ClassificationOutput:
        images, labels = batch
        logits = self.net(images)
        return ClassificationOutput(F.cross_entropy(logits, labels), logits, labels)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> TrainOutput:
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> ClassificationOutput:
        return self.classify(batch)


def digits(limit: int | None = None) -> tuple[Any, Any]:
    """Train and validation loaders: pixels scaled to [0, 1], a fixed 80/20 split."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:limit]
    cut = len(order) * 4 // 5
    items = [(x[i], y[i]) for i in order.tolist()]
    train = DataLoaderBuilder().batch_size(64).shuffle(0).build(items[:cut])
    valid = DataLoaderBuilder().batch_size(256).build(items[cut:])
    return train, valid


def objective(trial: optuna.Trial, root: Path, epochs: int, data: tuple[Any, Any]) -> float:
    """One trial: an ember run in `root/trial-N`; its last validation loss."""
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    width = trial.suggest_int("width", 8, 128, log=True)
    pruning = OptunaPruning(trial, "Loss", split="valid")
    ember.seed(trial.number)
    learner = (
        LearnerBuilder(root / f"trial-{trial.number}", overwrite=True)
        .hparams({"lr": lr, "width": width, "epochs": epochs})
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .with_file_checkpointer(DefaultRecorder())
        .pruning(pruning)
        .renderer(PlainRenderer(interval=3600))
        .num_epochs(epochs)
        .build(Mlp(width), AdamConfig().init(), lr)
    )
    learner.fit(*data)
    pruning.raise_if_pruned()  # Optuna records the trial as pruned
    return learner.history[-1][1]["valid"]["Loss"]


def search(
    storage: str,
    root: Path,
    trials: int,
    epochs: int,
    pruner: optuna.pruners.BasePruner | None = None,
    limit: int | None = None,
    study_name: str = "digits",
) -> optuna.Study:
    """Run `trials` trials (more, if the study already holds some: it continues)."""
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
        load_if_exists=True,
    )
    data = digits(limit)
    study.optimize(lambda trial: objective(trial, root, epochs, data), n_trials=trials)
    return study


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--root", type=Path, default=Path("artifacts/sweep"))
    parser.add_argument("--storage", default=None, help="default: sqlite:///ROOT/study.db")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{args.root / 'study.db'}"
    study = search(storage, args.root, args.trials, args.epochs)
    states = [trial.state.name for trial in study.trials]
    print(f"{states.count('COMPLETE')} trials completed, {states.count('PRUNED')} pruned")
    print(
        f"best: trial {study.best_trial.number}, {study.best_params}, loss {study.best_value:.4f}"
    )


if __name__ == "__main__":
    main()
