"""Schedulers run one after another, switching at given steps (e.g. warm-up, then cosine).

The scheduler is defined in `ember.lr.nesting`, its config (which nests any scheduler
config) beside `LrSchedulerConfig` in `ember.lr.config_union`."""

from ember.lr.config_union import SequentialLrSchedulerConfig
from ember.lr.nesting import SequentialLrScheduler

__all__ = ["SequentialLrScheduler", "SequentialLrSchedulerConfig"]
