"""ember schedulers driven by `LrDriver` around a real torch optimizer."""

from __future__ import annotations

import pytest
import torch

from ember.errors import TrainingError
from ember.lr import (
    CosineAnnealingLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrDriver,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    WarmupLrSchedulerConfig,
)

CONFIG = SequentialLrSchedulerConfig(
    schedulers=[
        LinearLrSchedulerConfig(initial_lr=0.001, final_lr=0.1, num_iters=4),
        WarmupLrSchedulerConfig(
            scheduler=CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=12, min_lr=0.005),
            warmup_steps=3,
            start_factor=0.5,
        ),
    ],
    milestones=[4],
)


def make_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    groups = [{"params": model[0].parameters()}, {"params": model[1].parameters(), "momentum": 0.5}]
    return model, torch.optim.SGD(groups, lr=123.0)


def train_steps(model, optimizer, driver, reference, n):
    """Run `n` optimizer steps through `driver`, checking every group's rate against `reference`."""
    inputs = torch.randn(8, 3)
    for _ in range(n):
        expected = reference.step()
        assert driver.before_step() == expected
        assert [group["lr"] for group in optimizer.param_groups] == [expected, expected]
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        driver.after_step()
        assert driver.last_lr == expected


def test_driver_writes_the_scheduler_rate_before_each_step():
    model, optimizer = make_optimizer()
    driver = LrDriver(CONFIG.init(), optimizer)
    assert not driver.is_torch
    train_steps(model, optimizer, driver, CONFIG.init(), 30)


def test_driver_state_resumes_the_schedule():
    model, optimizer = make_optimizer()
    reference = CONFIG.init()
    driver = LrDriver(CONFIG.init(), optimizer)
    train_steps(model, optimizer, driver, reference, 9)
    state = driver.state_dict()

    model, optimizer = make_optimizer()
    resumed = LrDriver(CONFIG.init(), optimizer)
    resumed.load_state_dict(state)
    train_steps(model, optimizer, resumed, reference, 15)


def test_driver_refuses_the_state_of_another_scheduler():
    _, optimizer = make_optimizer()
    cosine = LrDriver(
        CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=5).init(), optimizer
    )
    step = LrDriver(StepLrSchedulerConfig(initial_lr=0.1, step_size=5).init(), optimizer)
    with pytest.raises(TrainingError, match="CosineAnnealingLrScheduler.*StepLrScheduler"):
        step.load_state_dict(cosine.state_dict())
