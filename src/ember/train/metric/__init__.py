"""Metrics: the protocol, the input types outputs adapt to, and the built-in metrics."""

from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.adapt import adapt
from ember.train.metric.base import Metric, MetricMetadata, MetricValue
from ember.train.metric.inputs import (
    ClassificationInput,
    LossInput,
    MultiLabelInput,
    RegressionInput,
    SequenceInput,
)
from ember.train.metric.loss import LossMetric

__all__ = [
    "AccuracyMetric",
    "ClassificationInput",
    "LossInput",
    "LossMetric",
    "Metric",
    "MetricMetadata",
    "MetricValue",
    "MultiLabelInput",
    "RegressionInput",
    "SequenceInput",
    "adapt",
]
