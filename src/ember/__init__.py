"""ember: a training loop for PyTorch."""

from typing import TYPE_CHECKING

from ember._lazy import attach
from ember._version import __version__

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "Config": "ember.config",
        "compare": "ember.comparison",
        "runs": "ember.comparison",
        "ConfigError": "ember.errors",
        "DatasetError": "ember.errors",
        "EmberError": "ember.errors",
        "RecordError": "ember.errors",
        "RunRecordError": "ember.errors",
        "TrainingError": "ember.errors",
        "is_main_process": "ember.process",
        "seed": "ember.seed",
    },
)
__all__ += ["__version__"]

if TYPE_CHECKING:
    from ember.comparison import compare, runs
    from ember.config import Config
    from ember.errors import (
        ConfigError,
        DatasetError,
        EmberError,
        RecordError,
        RunRecordError,
        TrainingError,
    )
    from ember.process import is_main_process
    from ember.seed import seed
