"""Metric loggers: where metric values are written (files by default)."""

from ember.train.logger.base import MetricLogger, MetricRecord
from ember.train.logger.file import FileMetricLogger, metric_file_name, read_metric_log

__all__ = [
    "FileMetricLogger",
    "MetricLogger",
    "MetricRecord",
    "metric_file_name",
    "read_metric_log",
]
