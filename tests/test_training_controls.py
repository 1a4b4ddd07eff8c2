"""Gradient accumulation, early stopping, mixed precision, clipping and the NaN guard."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset, Classifier
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.early_stopping import MetricEarlyStoppingStrategy
from ember.train.metric import AccuracyMetric, LossMetric


class Linear(nn.Module):
    """No dropout: accumulation must then match a large batch exactly (up to float sums)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 3)

    def forward(self, x):
        return self.layer(x)

    def train_step(self, batch):
        output = self(batch.inputs)
        return TrainOutput(
            ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)
        )

    def valid_step(self, batch):
        return self.train_step(batch).item


def train_linear(tmp_path, quiet, batch: int, accumulation: int, size: int = 100) -> Linear:
    ember.seed(1)
    model = Linear()
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(batch).shuffle(4).build(BlobDataset(size))
    (
        LearnerBuilder(tmp_path, overwrite=True)
        .metric_train_numeric(LossMetric())
        .grads_accumulation(accumulation)
        .num_epochs(2)
        .renderer(quiet)
        .build(model, SgdConfig().init(), 0.1)
        .fit(loader)
    )
    return model


@pytest.mark.parametrize("size", [96, 100])  # 100: a partial last group (applied, not dropped)
def test_accumulating_n_batches_of_b_equals_one_batch_of_n_times_b(tmp_path, quiet, size):
    accumulated = train_linear(tmp_path / "a", quiet, batch=8, accumulation=4, size=size)
    large = train_linear(tmp_path / "b", quiet, batch=32, accumulation=1, size=size)
    for a, b in zip(accumulated.parameters(), large.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    lines = (tmp_path / "a" / "train" / "epoch-1" / "Loss.log").read_text().splitlines()
    assert len(lines) == -(-size // 8)  # a line per micro-batch


def test_accumulation_really_changes_training(tmp_path, quiet):
    accumulated = train_linear(tmp_path / "a", quiet, batch=8, accumulation=4)
    plain = train_linear(tmp_path / "b", quiet, batch=8, accumulation=1)
    assert not torch.allclose(accumulated.layer.weight, plain.layer.weight)


def test_early_stopping_stops_at_the_expected_epoch(tmp_path, quiet, loaders):
    class Scripted:
        """A validation metric whose epoch values are scripted: best at epoch 2."""

        name, input_type, unit = "Scripted", object, ""
        values = {1: 5.0, 2: 1.0, 3: 2.0, 4: 3.0, 5: 0.5}

        def update(self, item, meta):
            from ember.train.metric import MetricValue

            return MetricValue(self.values[meta.epoch], 1)

        def clear(self):
            pass

    strategy = MetricEarlyStoppingStrategy(Scripted(), direction="lowest", no_improvement_since=2)
    (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(Scripted())
        .early_stopping(strategy)
        .num_epochs(5)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
        .fit(*loaders)
    )
    assert sorted(p.name for p in (tmp_path / "valid").iterdir()) == [
        "epoch-1",
        "epoch-2",
        "epoch-3",
        "epoch-4",
    ]
    log = (tmp_path / "experiment.log").read_text()
    assert (
        "Early stopping after epoch 4: valid Scripted has not improved for 2 epochs (best 1 at epoch 2)"
        in log
    )
    assert "training stopped early" in quiet.stream_text.getvalue()


def test_warmup_epochs_delay_early_stopping():
    strategy = MetricEarlyStoppingStrategy("Loss", no_improvement_since=1, warmup_epochs=3)
    history = [(e, {"valid": {"Loss": float(e)}}) for e in range(1, 4)]
    assert strategy.should_stop(history) is None
    assert strategy.should_stop(history + [(4, {"valid": {"Loss": 9.0}})]) is not None


def test_bf16_autocast_trains_with_finite_loss(tmp_path, quiet, loaders):
    model = Classifier()
    (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .mixed_precision("bf16")
        .num_epochs(2)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
        .fit(*loaders)
    )
    values = [
        float(line.split(",")[0])
        for line in (tmp_path / "train" / "epoch-2" / "Loss.log").read_text().splitlines()
    ]
    assert all(v == v and abs(v) < 10 for v in values)
    assert "mixed precision bf16" in (tmp_path / "experiment.log").read_text()


def test_gradient_clipping_by_value_bounds_each_step(tmp_path, quiet, loaders):
    model = Classifier()
    before = [p.detach().clone() for p in model.parameters()]
    (
        LearnerBuilder(tmp_path)
        .grad_clipping(value=1e-3)
        .num_epochs(1)
        .renderer(quiet)
        .build(model, SgdConfig().init(), 1.0)
        .fit(loaders[0])
    )
    steps = 7  # 200 samples in batches of 32
    for a, b in zip(before, model.parameters()):
        assert (a - b).abs().max() <= steps * 1e-3 + 1e-7


class NanAt(Classifier):
    def __init__(self, bad_iteration: int):
        super().__init__()
        self.bad_iteration, self.calls = bad_iteration, 0

    def train_step(self, batch):
        self.calls += 1
        output = super().train_step(batch)
        if self.calls == self.bad_iteration:
            output.item.loss = output.item.loss * float("nan")
            output.loss = output.item.loss
        return output


def test_a_nan_loss_stops_with_epoch_and_iteration(tmp_path, quiet, loaders):
    model = NanAt(bad_iteration=10)  # epoch 2, iteration 3 (7 batches an epoch)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(3)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    with pytest.raises(
        TrainingError,
        match=r"loss is NaN at epoch 2, iteration 3\. The last good checkpoint is .*model-1\.mpk \(resume with checkpoint\(1\)\).*nonfinite_loss\('skip'\)",
    ):
        learner.fit(*loaders)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad step was not applied
    log = (tmp_path / "experiment.log").read_text()
    assert "loss is NaN at epoch 2, iteration 3" in log
    assert (tmp_path / "checkpoint" / "model-1.mpk").exists()  # the last good checkpoint


def test_skip_policy_drops_the_bad_step_and_goes_on(tmp_path, quiet, loaders):
    model = NanAt(bad_iteration=3)
    (
        LearnerBuilder(tmp_path)
        .nonfinite_loss("skip")
        .num_epochs(1)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
        .fit(*loaders)
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert (
        "Skipped the optimizer step at epoch 1, iteration 3"
        in (tmp_path / "experiment.log").read_text()
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.mixed_precision("fp8"), r"mixed_precision takes 'bf16' or 'fp16', got 'fp8'"),
        (lambda b: b.grad_clipping(norm=-1), r"grad_clipping\(norm=...\) must be a number > 0"),
        (lambda b: b.grad_clipping(), r"grad_clipping\(\) needs norm=... or value=..."),
        (lambda b: b.nonfinite_loss("ignore"), r"nonfinite_loss takes 'stop' or 'skip'"),
        (
            lambda b: MetricEarlyStoppingStrategy("Loss", no_improvement_since=0),
            r"no_improvement_since must be an int >= 1",
        ),
    ],
)
def test_bad_control_options_fail_at_once(tmp_path, call, message):
    with pytest.raises(ConfigError, match=message):
        call(LearnerBuilder(tmp_path))


def lr_lines(directory) -> list[float]:
    lines = (directory / "train" / "epoch-1" / "Learning_Rate.log").read_text().splitlines()
    return [float(line.split(",")[0]) for line in lines]


def test_an_ember_scheduler_is_stepped_once_per_optimizer_step(tmp_path, quiet, loaders):
    from ember.lr import StepLrSchedulerConfig
    from ember.train.metric import LearningRateMetric

    model = Classifier()
    (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LearningRateMetric())
        .grads_accumulation(2)
        .num_epochs(1)
        .renderer(quiet)
        .build(
            model,
            AdamConfig().init(),
            StepLrSchedulerConfig(initial_lr=0.1, step_size=2, gamma=0.5),
        )
        .fit(*loaders)
    )
    # 7 batches in groups of 2 -> 4 optimizer steps with rates 0.1, 0.1, 0.05, 0.05
    assert lr_lines(tmp_path) == [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05]


def test_a_torch_scheduler_is_accepted_and_stepped_after_each_optimizer_step(
    tmp_path, quiet, loaders
):
    from ember.train.metric import LearningRateMetric

    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LearningRateMetric())
        .num_epochs(1)
        .renderer(quiet)
        .build(model, optimizer, scheduler)
        .fit(*loaders)
    )
    assert lr_lines(tmp_path) == [0.5**i for i in range(7)]


def test_a_scheduler_state_of_another_type_is_refused_on_resume(tmp_path, quiet, loaders):
    from ember.lr import CosineAnnealingLrSchedulerConfig, StepLrSchedulerConfig

    def learner(lr, epochs, resume=False):
        builder = (
            LearnerBuilder(tmp_path)
            .with_file_checkpointer(DefaultRecorder())
            .num_epochs(epochs)
            .renderer(quiet)
        )
        if resume:
            builder = builder.checkpoint(1)
        return builder.build(Classifier(), AdamConfig().init(), lr)

    learner(StepLrSchedulerConfig(initial_lr=0.1, step_size=2), 1).fit(*loaders)
    with pytest.raises(
        TrainingError,
        match=r"state of a StepLrScheduler learning-rate scheduler, but this run uses CosineAnnealingLrScheduler",
    ):
        learner(CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=10), 2, resume=True).fit(
            *loaders
        )
