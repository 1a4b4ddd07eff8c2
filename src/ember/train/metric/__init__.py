"""Metrics: the protocol, the input types outputs adapt to, and the built-in metrics."""

from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.adapt import adapt
from ember.train.metric.auroc import AurocMetric
from ember.train.metric.average_precision import AucPrMetric
from ember.train.metric.base import Metric, MetricMetadata, MetricValue
from ember.train.metric.confusion import ConfusionMatrixMetric, MccMetric
from ember.train.metric.grad_norm import GradNormMetric
from ember.train.metric.hamming import HammingScoreMetric
from ember.train.metric.image import DiceMetric, MsSsimMetric, PsnrMetric, SsimMetric
from ember.train.metric.inputs import (
    ClassificationInput,
    ImageInput,
    LossInput,
    MultiLabelInput,
    RegressionInput,
    ScoresInput,
    SequenceInput,
    TextInput,
)
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossMetric
from ember.train.metric.nvml import CudaMetric
from ember.train.metric.perplexity import PerplexityMetric
from ember.train.metric.precision_recall import FBetaScoreMetric, PrecisionMetric, RecallMetric
from ember.train.metric.regression import MaeMetric, MseMetric, R2Metric, RmseMetric
from ember.train.metric.speed import IterationSpeedMetric
from ember.train.metric.system import (
    CpuMemoryMetric,
    CpuTemperatureMetric,
    CpuUseMetric,
    CudaMemoryMetric,
)
from ember.train.metric.text import BleuMetric, CerMetric, RougeMetric, WerMetric
from ember.train.metric.throughput import ThroughputMetric
from ember.train.metric.topk import TopKAccuracyMetric
from ember.train.metric.torchmetric import TorchMetric

__all__ = [
    "AccuracyMetric",
    "AucPrMetric",
    "AurocMetric",
    "BleuMetric",
    "CerMetric",
    "ClassificationInput",
    "ConfusionMatrixMetric",
    "CpuMemoryMetric",
    "CpuTemperatureMetric",
    "CpuUseMetric",
    "CudaMemoryMetric",
    "CudaMetric",
    "DiceMetric",
    "FBetaScoreMetric",
    "GradNormMetric",
    "HammingScoreMetric",
    "ImageInput",
    "IterationSpeedMetric",
    "LearningRateMetric",
    "LossInput",
    "LossMetric",
    "MaeMetric",
    "MccMetric",
    "Metric",
    "MetricMetadata",
    "MetricValue",
    "MsSsimMetric",
    "MseMetric",
    "MultiLabelInput",
    "PerplexityMetric",
    "PrecisionMetric",
    "PsnrMetric",
    "R2Metric",
    "RecallMetric",
    "RegressionInput",
    "RmseMetric",
    "RougeMetric",
    "ScoresInput",
    "SequenceInput",
    "TextInput",
    "ThroughputMetric",
    "TopKAccuracyMetric",
    "TorchMetric",
    "WerMetric",
    "adapt",
]
