"""Metric loggers: where metric values are written (files by default)."""

from ember.train.logger.base import MetricLogger, MetricRecord
from ember.train.logger.csv_logger import CsvMetricLogger
from ember.train.logger.file import FileMetricLogger, metric_file_name, read_metric_log
from ember.train.logger.memory import InMemoryMetricLogger
from ember.train.logger.mlflow_logger import MlflowMetricLogger, mlflow_key
from ember.train.logger.tensorboard_logger import TensorBoardMetricLogger

__all__ = [
    "CsvMetricLogger",
    "FileMetricLogger",
    "InMemoryMetricLogger",
    "MetricLogger",
    "MetricRecord",
    "MlflowMetricLogger",
    "TensorBoardMetricLogger",
    "metric_file_name",
    "mlflow_key",
    "read_metric_log",
]
