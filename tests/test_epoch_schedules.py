"""Schedulers written for one step per epoch, and ReduceLROnPlateau, as published
scripts use them: their rates per epoch, their place before the checkpoint, exact resume."""

from __future__ import annotations

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import TrainingError
from ember.lr import LinearLrSchedulerConfig
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.logger.file import read_metric_log
from ember.train.metric import LearningRateMetric, LossMetric


def builder(directory, quiet, epochs):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(LearningRateMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )


def rates(directory, epoch):
    return {
        value
        for value, _ in read_metric_log(
            directory / "train" / f"epoch-{epoch}" / "Learning_Rate.log"
        )
    }


def test_step_lr_per_epoch_follows_the_plain_loops_rates(tmp_path, loaders, quiet):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    builder(tmp_path, quiet, 3).build(model, optimizer, (schedule, "epoch")).fit(*loaders)
    # A plain loop steps StepLR once after each epoch: 1.0, 0.7, 0.49 (torch's own floats).
    reference = torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), step_size=1, gamma=0.7
    )
    for epoch in (1, 2, 3):
        assert rates(tmp_path, epoch) == {reference.get_last_lr()[0]}
        reference.optimizer.step()
        reference.step()


def test_a_per_epoch_schedule_stepped_per_step_is_warned_about(tmp_path, loaders, quiet):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # 0.5**7
    builder(tmp_path, quiet, 1).build(model, optimizer, schedule).fit(*loaders)
    log = (tmp_path / "experiment.log").read_text()
    assert "StepLR is stepped after every optimizer step (7 per epoch)" in log
    assert "(scheduler, 'epoch')" in log


class ScriptedLoss:
    """A validation "Loss" whose epoch values are scripted: it gets worse at epoch 3."""

    name, unit, input_type = "Loss", "", object
    values = {1: 3.0, 2: 0.5, 3: 2.0, 4: 0.25}

    def update(self, item, meta):
        from ember.train.metric import MetricValue

        return MetricValue(self.values[meta.epoch], 1)

    def clear(self):
        pass


def plateau_run(directory, quiet, loaders, epochs, resume=None):
    ember.seed(3)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    run = (
        LearnerBuilder(directory)
        .metric_train_numeric(LearningRateMetric())
        .metric_valid_numeric(ScriptedLoss())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )
    if resume is not None:
        run = run.checkpoint(resume)
    learner = run.build(model, optimizer, plateau)
    return learner, learner.fit(*loaders)


def test_reduce_on_plateau_steps_on_the_validation_loss_and_resumes_exactly(
    tmp_path, loaders, quiet
):
    _, model = plateau_run(tmp_path / "a", quiet, loaders, 4)
    # Losses 3.0, 0.5, 2.0, 0.25: only epoch 3 does not improve, so epoch 4 runs at half.
    assert [rates(tmp_path / "a", epoch) for epoch in (1, 2, 3, 4)] == [{0.5}, {0.5}, {0.5}, {0.25}]

    plateau_run(tmp_path / "b", quiet, loaders, 2)
    _, resumed = plateau_run(tmp_path / "b", quiet, loaders, 4, resume=2)
    for epoch in (3, 4):
        assert rates(tmp_path / "a", epoch) == rates(tmp_path / "b", epoch)
    for name, value in model.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_reduce_on_plateau_needs_its_metric_before_training(tmp_path, loaders, quiet):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .lr_monitor("Accuracy", "valid")
        .renderer(quiet)
        .build(model, optimizer, plateau)
    )
    with pytest.raises(TrainingError, match=r"ReduceLROnPlateau steps on .*valid 'Accuracy'"):
        learner.fit(*loaders)
    assert not (tmp_path / "train").exists()


def test_an_ember_schedule_per_epoch(tmp_path, loaders, quiet):
    schedule = LinearLrSchedulerConfig(initial_lr=0.3, final_lr=0.1, num_iters=2)
    builder(tmp_path, quiet, 3).build(Classifier(), AdamConfig().init(), (schedule, "epoch")).fit(
        *loaders
    )
    assert [rates(tmp_path, epoch) for epoch in (1, 2, 3)] == [{0.3}, {0.2}, {0.1}]
