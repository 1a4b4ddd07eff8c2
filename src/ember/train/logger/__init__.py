"""Metric loggers: where metric values are written (files by default)."""

from typing import TYPE_CHECKING

from ember._lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "CsvMetricLogger": "ember.train.logger.csv_logger",
        "FileMetricLogger": "ember.train.logger.file",
        "InMemoryMetricLogger": "ember.train.logger.memory",
        "MetricLogger": "ember.train.logger.base",
        "MetricRecord": "ember.train.logger.base",
        "MlflowMetricLogger": "ember.train.logger.mlflow_logger",
        "WandbMetricLogger": "ember.train.logger.wandb_logger",
        "RunStart": "ember.train.logger.base",
        "TensorBoardMetricLogger": "ember.train.logger.tensorboard_logger",
        "metric_file_name": "ember.train.logger.file",
        "mlflow_key": "ember.train.logger.mlflow_logger",
        "read_metric_log": "ember.train.logger.file",
        "start_loggers": "ember.train.logger.base",
    },
)

if TYPE_CHECKING:
    from ember.train.logger.base import MetricLogger, MetricRecord, RunStart, start_loggers
    from ember.train.logger.csv_logger import CsvMetricLogger
    from ember.train.logger.file import FileMetricLogger, metric_file_name, read_metric_log
    from ember.train.logger.memory import InMemoryMetricLogger
    from ember.train.logger.mlflow_logger import MlflowMetricLogger, mlflow_key
    from ember.train.logger.tensorboard_logger import TensorBoardMetricLogger
    from ember.train.logger.wandb_logger import WandbMetricLogger
