"""Learning-rate schedulers, stepped once per optimizer step."""

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

__all__ = [
    "ComposedLrScheduler",
    "ComposedLrSchedulerConfig",
    "ConstantLr",
    "ConstantLrConfig",
    "CosineAnnealingLrScheduler",
    "CosineAnnealingLrSchedulerConfig",
    "ExponentialLrScheduler",
    "ExponentialLrSchedulerConfig",
    "LinearLrScheduler",
    "LinearLrSchedulerConfig",
    "LrDriver",
    "LrScheduler",
    "LrSchedulerConfig",
    "NoamLrScheduler",
    "NoamLrSchedulerConfig",
    "SchedulerReduction",
    "SequentialLrScheduler",
    "SequentialLrSchedulerConfig",
    "StepLrScheduler",
    "StepLrSchedulerConfig",
    "WarmupLrScheduler",
    "WarmupLrSchedulerConfig",
    "lr_at_steps",
]
