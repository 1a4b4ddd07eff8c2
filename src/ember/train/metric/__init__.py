"""Metrics: the protocol, the input types outputs adapt to, and the built-in metrics."""

from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.adapt import adapt
from ember.train.metric.auroc import AurocMetric
from ember.train.metric.base import Metric, MetricMetadata, MetricValue
from ember.train.metric.grad_norm import GradNormMetric
from ember.train.metric.hamming import HammingScoreMetric
from ember.train.metric.inputs import (
    ClassificationInput,
    LossInput,
    MultiLabelInput,
    RegressionInput,
    ScoresInput,
    SequenceInput,
)
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossMetric
from ember.train.metric.perplexity import PerplexityMetric
from ember.train.metric.precision_recall import FBetaScoreMetric, PrecisionMetric, RecallMetric
from ember.train.metric.speed import IterationSpeedMetric
from ember.train.metric.system import CpuMemoryMetric, CpuUseMetric, CudaMemoryMetric
from ember.train.metric.topk import TopKAccuracyMetric
from ember.train.metric.torchmetric import TorchMetric

__all__ = [
    "AccuracyMetric",
    "AurocMetric",
    "ClassificationInput",
    "CpuMemoryMetric",
    "CpuUseMetric",
    "CudaMemoryMetric",
    "FBetaScoreMetric",
    "GradNormMetric",
    "HammingScoreMetric",
    "IterationSpeedMetric",
    "LearningRateMetric",
    "LossInput",
    "LossMetric",
    "Metric",
    "MetricMetadata",
    "MetricValue",
    "MultiLabelInput",
    "PerplexityMetric",
    "PrecisionMetric",
    "RecallMetric",
    "RegressionInput",
    "ScoresInput",
    "SequenceInput",
    "TopKAccuracyMetric",
    "TorchMetric",
    "adapt",
]
