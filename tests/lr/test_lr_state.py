"""Scheduler states: plain data that resumes the exact sequence, and clear errors on a mismatch."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from ember.errors import ConfigError
from ember.lr import (
    ComposedLrScheduler,
    ComposedLrSchedulerConfig,
    ConstantLr,
    ConstantLrConfig,
    CosineAnnealingLrSchedulerConfig,
    ExponentialLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrScheduler,
    NoamLrSchedulerConfig,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    WarmupLrSchedulerConfig,
    lr_at_steps,
)

CONFIGS = {
    "noam": NoamLrSchedulerConfig(init_lr=1.0, warmup_steps=6, model_size=16),
    "exponential": ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.9),
    "step": StepLrSchedulerConfig(initial_lr=0.1, step_size=4),
    "cosine": CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=9, min_lr=0.01),
    "linear": LinearLrSchedulerConfig(initial_lr=0.0, final_lr=0.1, num_iters=15),
    "composed": ComposedLrSchedulerConfig(
        schedulers=[
            CosineAnnealingLrSchedulerConfig(initial_lr=1.0, num_iters=7),
            ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.95),
            ConstantLrConfig(lr=0.5),
        ],
        reduction="avg",
    ),
    "sequential": SequentialLrSchedulerConfig(
        schedulers=[
            LinearLrSchedulerConfig(initial_lr=0.01, final_lr=0.1, num_iters=5),
            WarmupLrSchedulerConfig(
                scheduler=StepLrSchedulerConfig(initial_lr=0.1, step_size=3, gamma=0.5),
                warmup_steps=4,
                start_factor=0.5,
            ),
            ComposedLrSchedulerConfig(
                schedulers=[
                    ExponentialLrSchedulerConfig(initial_lr=0.05, gamma=0.9),
                    NoamLrSchedulerConfig(init_lr=1.0, warmup_steps=3, model_size=1),
                ]
            ),
        ],
        milestones=[5, 16],
    ),
    "warmup": WarmupLrSchedulerConfig(
        scheduler=CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=20), warmup_steps=5
    ),
}


def assert_plain(value: Any) -> None:
    """Only the types every ember recorder stores: dicts with str keys, lists, str, int, float."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            assert_plain(item)
    elif isinstance(value, list):
        for item in value:
            assert_plain(item)
    else:
        assert type(value) in (str, int, float), value


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("cut", [0, 3, 5, 17, 26])
def test_state_resumes_the_exact_sequence(name, cut):
    config = CONFIGS[name]
    full = lr_at_steps(config.init(), 40)
    first = config.init()
    assert lr_at_steps(first, cut) == full[:cut]
    state = first.state_dict()
    assert_plain(state)
    assert state["type"] == type(first).__name__
    stored = json.loads(json.dumps(state))
    assert msgpack.unpackb(msgpack.packb(state)) == state

    resumed = config.init()
    resumed.load_state_dict(stored)
    assert lr_at_steps(resumed, 40 - cut) == full[cut:]
    # Loading does not disturb the scheduler the state was taken from.
    assert lr_at_steps(first, 40 - cut) == full[cut:]


def test_every_scheduler_follows_the_protocol():
    for config in CONFIGS.values():
        assert isinstance(config.init(), LrScheduler)


def test_cosine_state_into_a_step_scheduler_names_both_types():
    cosine = CONFIGS["cosine"].init()
    lr_at_steps(cosine, 3)
    step = CONFIGS["step"].init()
    with pytest.raises(ConfigError) as info:
        step.load_state_dict(cosine.state_dict())
    message = str(info.value)
    assert "CosineAnnealingLrScheduler" in message and "StepLrScheduler" in message


def test_nested_state_of_another_type_is_refused():
    config = CONFIGS["warmup"]
    other = config.with_(scheduler=CONFIGS["linear"])
    state = other.init().state_dict()
    with pytest.raises(ConfigError, match="LinearLrScheduler.*CosineAnnealingLrScheduler"):
        config.init().load_state_dict(state)


@pytest.mark.parametrize(
    "name, key",
    [
        ("cosine", "step"),
        ("composed", "schedulers"),
        ("sequential", "step"),
        ("warmup", "scheduler"),
    ],
)
def test_missing_key_is_named(name, key):
    scheduler = CONFIGS[name].init()
    state = scheduler.state_dict()
    del state[key]
    with pytest.raises(ConfigError, match=repr(key)):
        scheduler.load_state_dict(state)


def test_state_without_a_type_or_not_a_dict_is_refused():
    scheduler = CONFIGS["step"].init()
    with pytest.raises(ConfigError, match="'type'"):
        scheduler.load_state_dict({"step": 3})
    with pytest.raises(ConfigError, match="expects the dict"):
        scheduler.load_state_dict([3])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="integer >= 0"):
        scheduler.load_state_dict({"type": "StepLrScheduler", "step": -2})


def test_state_with_another_number_of_schedulers_is_refused():
    two = ComposedLrScheduler([ConstantLr(0.1), ConstantLr(0.2)])
    three = ComposedLrScheduler([ConstantLr(0.1), ConstantLr(0.2), ConstantLr(0.3)])
    with pytest.raises(ConfigError, match="3 scheduler states.*combines 2"):
        two.load_state_dict(three.state_dict())
