"""Learning-rate schedulers, stepped once per optimizer step."""

from typing import TYPE_CHECKING

from ember._lazy import attach

# Configs resolve through config_union, which completes the configs that nest others.
__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "ComposedLrScheduler": "ember.lr.composed",
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
        "SchedulerReduction": "ember.lr.composed",
        "SequentialLrScheduler": "ember.lr.sequential",
        "SequentialLrSchedulerConfig": "ember.lr.config_union",
        "StepLrScheduler": "ember.lr.step",
        "StepLrSchedulerConfig": "ember.lr.config_union",
        "WarmupLrScheduler": "ember.lr.warmup",
        "WarmupLrSchedulerConfig": "ember.lr.config_union",
        "lr_at_steps": "ember.lr._common",
    },
)

if TYPE_CHECKING:
    from ember.lr._common import lr_at_steps
    from ember.lr.base import LrDriver, LrScheduler
    from ember.lr.composed import ComposedLrScheduler, ComposedLrSchedulerConfig, SchedulerReduction
    from ember.lr.config_union import LrSchedulerConfig
    from ember.lr.constant import ConstantLr, ConstantLrConfig
    from ember.lr.cosine import CosineAnnealingLrScheduler, CosineAnnealingLrSchedulerConfig
    from ember.lr.exponential import ExponentialLrScheduler, ExponentialLrSchedulerConfig
    from ember.lr.linear import LinearLrScheduler, LinearLrSchedulerConfig
    from ember.lr.noam import NoamLrScheduler, NoamLrSchedulerConfig
    from ember.lr.sequential import SequentialLrScheduler, SequentialLrSchedulerConfig
    from ember.lr.step import StepLrScheduler, StepLrSchedulerConfig
    from ember.lr.warmup import WarmupLrScheduler, WarmupLrSchedulerConfig
