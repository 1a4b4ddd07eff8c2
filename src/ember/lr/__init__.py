"""Learning-rate schedulers, stepped once per optimizer step."""

from typing import TYPE_CHECKING

from ember._lazy import attach

# Every config resolves through config_union, which defines the configs that nest others.
__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "ComposedLrScheduler": "ember.lr.nesting",
        "ComposedLrSchedulerConfig": "ember.lr.config_union",
        "ConstantLr": "ember.lr.constant",
        "ConstantLrConfig": "ember.lr.config_union",
        "CosineAnnealingLrScheduler": "ember.lr.cosine",
        "CosineAnnealingLrSchedulerConfig": "ember.lr.config_union",
        "ExponentialLrScheduler": "ember.lr.exponential",
        "ExponentialLrSchedulerConfig": "ember.lr.config_union",
        "LinearLrScheduler": "ember.lr.linear",
        "LinearLrSchedulerConfig": "ember.lr.config_union",
        "LrDriver": "ember.lr.base",
        "LrScheduler": "ember.lr.base",
        "LrSchedulerConfig": "ember.lr.config_union",
        "NoamLrScheduler": "ember.lr.noam",
        "NoamLrSchedulerConfig": "ember.lr.config_union",
        "SchedulerReduction": "ember.lr.nesting",
        "SequentialLrScheduler": "ember.lr.nesting",
        "SequentialLrSchedulerConfig": "ember.lr.config_union",
        "StepLrScheduler": "ember.lr.step",
        "StepLrSchedulerConfig": "ember.lr.config_union",
        "WarmupLrScheduler": "ember.lr.nesting",
        "WarmupLrSchedulerConfig": "ember.lr.config_union",
        "lr_at_steps": "ember.lr._common",
    },
)

if TYPE_CHECKING:
    from ember.lr._common import lr_at_steps
    from ember.lr.base import LrDriver, LrScheduler
    from ember.lr.config_union import (
        ComposedLrSchedulerConfig,
        LrSchedulerConfig,
        SequentialLrSchedulerConfig,
        WarmupLrSchedulerConfig,
    )
    from ember.lr.constant import ConstantLr, ConstantLrConfig
    from ember.lr.cosine import CosineAnnealingLrScheduler, CosineAnnealingLrSchedulerConfig
    from ember.lr.exponential import ExponentialLrScheduler, ExponentialLrSchedulerConfig
    from ember.lr.linear import LinearLrScheduler, LinearLrSchedulerConfig
    from ember.lr.nesting import (
        ComposedLrScheduler,
        SchedulerReduction,
        SequentialLrScheduler,
        WarmupLrScheduler,
    )
    from ember.lr.noam import NoamLrScheduler, NoamLrSchedulerConfig
    from ember.lr.step import StepLrScheduler, StepLrSchedulerConfig
