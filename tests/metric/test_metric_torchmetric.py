"""TorchMetric: a wrapped torchmetrics metric gives the sklearn epoch value."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import f1_score, mean_absolute_error

from ember.train.metric.inputs import RegressionInput
from ember.train.metric.torchmetric import TorchMetric
from ember.train.output import ClassificationOutput, RegressionOutput

SIZES = [32, 32, 32, 7]
N = sum(SIZES)
ZERO = torch.tensor(0.0)


def test_multiclass_f1_macro_matches_sklearn(drive):
    from torchmetrics.classification import MulticlassF1Score

    g = torch.Generator().manual_seed(40)
    logits = torch.randn(N, 5, generator=g)
    targets = torch.randint(0, 5, (N,), generator=g)
    outputs = [
        ClassificationOutput(ZERO, x, y) for x, y in zip(logits.split(SIZES), targets.split(SIZES))
    ]
    metric = TorchMetric(MulticlassF1Score(num_classes=5, average="macro"))
    assert metric.name == "MulticlassF1Score"
    assert metric.higher_is_better is True
    value, values = drive(metric, outputs, warmup=outputs[:2][::-1])
    predicted = logits.argmax(-1).numpy()
    expected = f1_score(targets.numpy(), predicted, average="macro", zero_division=0)
    assert value == pytest.approx(expected, rel=1e-5)
    assert all(isinstance(v.value, torch.Tensor) for v in values)
    first = f1_score(targets[:32].numpy(), logits[:32].argmax(-1).numpy(), average="macro")
    assert float(values[0].value) == pytest.approx(first, rel=1e-5)


def test_regression_metric_with_name(drive):
    from torchmetrics.regression import MeanAbsoluteError

    g = torch.Generator().manual_seed(41)
    predictions, targets = torch.randn(N, generator=g), torch.randn(N, generator=g)
    outputs = [
        RegressionOutput(ZERO, x, y) for x, y in zip(predictions.split(SIZES), targets.split(SIZES))
    ]
    metric = TorchMetric(MeanAbsoluteError(), name="MAE", input_type=RegressionInput)
    assert metric.higher_is_better is False
    value, _ = drive(metric, outputs)
    assert metric.name == "MAE"
    expected = mean_absolute_error(targets.numpy(), predictions.numpy())
    assert value == pytest.approx(expected, rel=1e-5)
