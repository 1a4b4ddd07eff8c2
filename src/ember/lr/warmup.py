"""Linear warm-up in front of any scheduler, which keeps stepping during the warm-up.

The scheduler is defined in `ember.lr.nesting`, its config (which nests any scheduler
config) beside `LrSchedulerConfig` in `ember.lr.config_union`."""

from ember.lr.config_union import WarmupLrSchedulerConfig
from ember.lr.nesting import WarmupLrScheduler

__all__ = ["WarmupLrScheduler", "WarmupLrSchedulerConfig"]
