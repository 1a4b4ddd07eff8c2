"""ember: a training loop for PyTorch."""

from ember._version import __version__
from ember.config import Config
from ember.errors import ConfigError, DatasetError, EmberError, RecordError, TrainingError
from ember.process import is_main_process
from ember.seed import seed

__all__ = [
    "Config",
    "ConfigError",
    "DatasetError",
    "EmberError",
    "RecordError",
    "TrainingError",
    "__version__",
    "is_main_process",
    "seed",
]
