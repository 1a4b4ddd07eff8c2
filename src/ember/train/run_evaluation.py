"""`evaluate_run`: a run's best (or any) checkpoint evaluated in one call.

The checkpoint is named, never its path: "best" (by the run's history), "last" or an
epoch number (`ember.train.checkpoint.load`). The evaluation is an `Evaluator`'s,
written into the run's own directory, `test/<name>/`, beside its training files.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import torch

from ember.errors import ConfigError
from ember.train.checkpoint.load import choose, load_epoch, run_checkpoints
from ember.train.evaluator import EvaluatorBuilder

__all__ = ["evaluate_run"]


def evaluate_run(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    loader: Iterable[Any],
    *metrics: Any,
    checkpoint: int | str = "best",
    best_by: Any = "Loss",
    name: str | None = None,
    device: str | torch.device | None = None,
    renderer: Any = None,
) -> dict[str, float]:
    """Load a checkpoint of the run in `directory` into `model` (a fresh instance of
    the run's model class) and evaluate it on `loader` with `metrics`; return
    `{metric: value}` over the whole set.

    `checkpoint`: "best" (default), "last" or an epoch number. The best is the saved
    epoch with the lowest validation value of `best_by` in the run's history (default
    "Loss"; a metric or its name), or the one a checkpointing strategy given as
    `best_by` chooses (`MetricCheckpointingStrategy(AccuracyMetric(),
    direction="highest")`). The evaluation is written to `test/<name>/` of the run
    (default name "epoch-N", N the epoch evaluated), as `Evaluator.eval` writes it;
    `device` (default: the model's) and `renderer` as on `EvaluatorBuilder`."""
    if not metrics:
        raise ConfigError(
            "evaluate_run() needs at least one metric, e.g. evaluate_run(directory, model, "
            "loader, AccuracyMetric(), LossMetric())."
        )
    checkpointer = run_checkpoints(directory)
    epoch, _ = choose(directory, checkpointer, checkpoint, best_by)
    builder = EvaluatorBuilder(directory)
    for metric in metrics:
        builder.metric_numeric(metric)
    if renderer is not None:
        builder.renderer(renderer)
    if device is not None:
        builder.devices([device])
    load_epoch(checkpointer, epoch, model)
    evaluator = builder.build(model)
    return evaluator.eval(f"epoch-{epoch}" if name is None else name, loader)
