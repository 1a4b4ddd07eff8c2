"""Several schedulers stepped together, their rates combined (product, sum or mean).

The scheduler is defined in `ember.lr.nesting`, its config (which nests any scheduler
config) beside `LrSchedulerConfig` in `ember.lr.config_union`."""

from ember.lr.config_union import ComposedLrSchedulerConfig
from ember.lr.nesting import ComposedLrScheduler, SchedulerReduction

__all__ = ["ComposedLrScheduler", "ComposedLrSchedulerConfig", "SchedulerReduction"]
