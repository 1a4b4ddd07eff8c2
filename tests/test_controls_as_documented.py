"""Controls as the documentation describes them: `max_time(seconds=...)`, the EMA's
warm-up counting, reading `ctx.loss` in a callback, and a diverging run in a sweep
ending with an outcome rather than an exception."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, MetricEarlyStoppingStrategy
from ember.train.callbacks import EMA, Callback
from ember.train.metric import LossMetric


class Slow(Classifier):
    def train_step(self, batch):
        import time

        time.sleep(0.05)
        return super().train_step(batch)


def test_max_time_takes_seconds(tmp_path, loaders, quiet):
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .max_time(seconds=1.5)
        .num_epochs(100)
        .renderer(quiet)
        .build(Slow(), AdamConfig().init(), 1e-2)
    )
    learner.fit(loaders[0])
    assert learner.outcome == "stopped: time limit reached (max_time 2s)"
    assert learner.exit_code == 75
    assert len(learner.history) < 10
    assert LearnerBuilder(tmp_path).max_time(minutes=1, seconds=30)._state.max_time == 90.0
    with pytest.raises(ConfigError, match=r"max_time\(seconds=...\) must be a number >= 0"):
        LearnerBuilder(tmp_path).max_time(seconds=-1)
    with pytest.raises(ConfigError, match=r"max_time\(seconds=...\) must be a number >= 0"):
        LearnerBuilder(tmp_path).max_time(seconds="30")


class Recorder(Callback):
    """Keeps the weights after each optimizer step and the loss before each backward."""

    def __init__(self):
        self.weights, self.losses = [], []

    def on_fit_start(self, ctx):
        self.weights.append(ctx.model.net[0].weight.detach().clone())

    def on_before_backward(self, ctx):
        self.losses.append(ctx.loss.item())

    def on_after_optimizer_step(self, ctx):
        self.weights.append(ctx.model.net[0].weight.detach().clone())


def test_the_ema_warm_up_counts_the_updates_made_before(tmp_path, loaders, quiet):
    """n is the number of updates before this one: the first uses d = 1/10, the
    second 2/11, each after the optimizer step it follows."""
    ema, seen = EMA(decay=0.999), Recorder()
    ember.seed(0)
    learner = (
        LearnerBuilder(tmp_path / "run")
        .callback(seen)
        .callback(ema)
        .limit_batches(train=2)
        .num_epochs(1)
        .renderer(quiet)
        .build(Classifier(dropout=0.0), AdamConfig().init(), 1e-2)
    )
    learner.fit(loaders[0])
    start, first, second = seen.weights
    assert ema.updates == 2
    after_one = 0.1 * start + 0.9 * first
    d = 2 / 11
    expected = d * after_one + (1 - d) * second
    assert torch.allclose(ema.shadow["net.0.weight"], expected, atol=1e-6)


def grad_warnings(tmp_path, loaders, quiet, callback) -> list:
    """The warnings about converting a tensor that requires grad in a run with `callback`."""
    learner = (
        LearnerBuilder(tmp_path / "run", overwrite=True)
        .callback(callback)
        .num_epochs(1)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.fit(loaders[0])
    return [w for w in caught if "requires_grad" in str(w.message)]


class Converting(Callback):
    def __init__(self):
        self.losses = []

    def on_before_backward(self, ctx):
        self.losses.append(float(ctx.loss))


def test_ctx_loss_read_with_item_raises_no_warning_where_float_does(tmp_path, loaders, quiet):
    """Why the documentation says `.item()`: `float(ctx.loss)` converts a tensor that
    requires grad, which torch warns about."""
    seen = Recorder()
    assert grad_warnings(tmp_path, loaders, quiet, seen) == []
    assert len(seen.losses) == 7 and all(isinstance(v, float) for v in seen.losses)
    converting = Converting()
    assert grad_warnings(tmp_path, loaders, quiet, converting)
    assert len(converting.losses) == 7


def sweep(tmp_path, loaders, quiet, lr, skip):
    builder = (
        LearnerBuilder(tmp_path / f"lr-{lr:g}-{skip}")
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .early_stopping(MetricEarlyStoppingStrategy(LossMetric(), divergence_threshold=1e3))
        .num_epochs(3)
        .renderer(quiet)
    )
    if skip:
        builder = builder.nonfinite_loss("skip")
    ember.seed(0)
    return builder.build(Classifier(dropout=0.0), SgdConfig().init(), lr)


def test_a_diverging_run_of_a_sweep_ends_with_an_outcome(tmp_path, loaders, quiet):
    """With nonfinite_loss("skip"), a step whose loss is not finite is skipped, the
    epoch's value is not finite, and early stopping ends the run after that epoch."""
    calm = sweep(tmp_path, loaders, quiet, 1e-2, skip=True)
    calm.fit(*loaders)
    assert calm.outcome == "completed"
    wild = sweep(tmp_path, loaders, quiet, 1e12, skip=True)
    wild.fit(*loaders)
    assert wild.outcome.startswith("stopped early: ")
    assert wild.exit_code == 0 and len(wild.history) == 1
    valid = wild.history[-1][1]["valid"]["Loss"]
    assert not math.isfinite(valid) or valid > 1e3
    # the default, nonfinite_loss("stop"), raises: the sweep would have to catch it
    raising = sweep(tmp_path, loaders, quiet, 1e12, skip=False)
    with pytest.raises(TrainingError) as error:
        raising.fit(*loaders)
    assert type(error.value).__name__ == "NonFiniteLoss"
    assert raising.outcome.startswith("failed")
