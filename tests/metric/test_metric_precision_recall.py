"""Precision, recall and F-beta in every mode against scikit-learn (and torchmetrics for top-k)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np
import pytest
import torch
from sklearn.metrics import fbeta_score, precision_score, recall_score

from ember.errors import ConfigError, TrainingError
from ember.train.metric.inputs import ClassificationInput
from ember.train.metric.precision_recall import FBetaScoreMetric, PrecisionMetric, RecallMetric
from ember.train.output import (
    ClassificationOutput,
    MultiLabelClassificationOutput,
    SequenceOutput,
)

SIZES = [32, 32, 32, 7]
N = sum(SIZES)
ZERO = torch.tensor(0.0)

# (label, metric class, beta or None, sklearn function)
KINDS = [
    ("precision", PrecisionMetric, None, precision_score),
    ("recall", RecallMetric, None, recall_score),
    ("f1", FBetaScoreMetric, 1.0, partial(fbeta_score, beta=1.0)),
    ("f0.5", FBetaScoreMetric, 0.5, partial(fbeta_score, beta=0.5)),
    ("f2", FBetaScoreMetric, 2.0, partial(fbeta_score, beta=2.0)),
]
KIND_IDS = [k[0] for k in KINDS]


def _make(kind: tuple, mode: str, **kwargs: Any) -> Any:
    _, cls, beta, _ = kind
    factory = getattr(cls, mode)
    return factory(**kwargs) if beta is None else factory(beta, **kwargs)


def _reference(kind: tuple) -> Callable[..., float]:
    function = kind[3]
    return lambda y, p, **kw: float(function(y, p, zero_division=0, **kw))


def _batches(output: torch.Tensor, targets: torch.Tensor, cls: type = ClassificationOutput):
    return [cls(ZERO, x, y) for x, y in zip(output.split(SIZES), targets.split(SIZES))]


def _multiclass_data(seed: int, classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, classes, generator=g), torch.randint(0, classes, (N,), generator=g)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_names(kind):
    metric = _make(kind, "multiclass")
    label, _, beta, _ = kind
    expected = {"precision": "Precision", "recall": "Recall"}.get(label) or f"F{beta:g} Score"
    assert metric.name == expected
    assert FBetaScoreMetric.binary().name == "F1 Score"
    assert FBetaScoreMetric.binary(0.5).name == "F0.5 Score"


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("shape", ["[N]", "[N,1]", "[N,2]"])
@pytest.mark.parametrize("threshold", [0.5, 0.3])
def test_binary(drive, kind, shape, threshold):
    g = torch.Generator().manual_seed(10)
    targets = torch.randint(0, 2, (N,), generator=g)
    if shape == "[N,2]":
        output = torch.randn(N, 2, generator=g)
        predicted = output.softmax(-1)[:, 1] > threshold
    else:
        output = torch.rand(N, generator=g)
        predicted = output > threshold
        if shape == "[N,1]":
            output = output.unsqueeze(-1)
    metric = _make(kind, "binary", threshold=threshold)
    warmup = _batches(output.flip(0), targets)
    value, values = drive(metric, _batches(output, targets), warmup=warmup)
    reference = _reference(kind)
    assert value == pytest.approx(reference(targets.numpy(), predicted.long().numpy()), rel=1e-5)
    first = reference(targets[:32].numpy(), predicted[:32].long().numpy())
    assert float(values[0].value) == pytest.approx(first, rel=1e-5, abs=1e-7)
    assert [int(v.weight) for v in values] == SIZES


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
def test_multiclass(drive, kind, reduction):
    logits, targets = _multiclass_data(11)
    metric = _make(kind, "multiclass", reduction=reduction)
    value, values = drive(metric, _batches(logits, targets), warmup=_batches(*_multiclass_data(12)))
    reference = _reference(kind)
    predicted = logits.argmax(-1).numpy()
    expected = reference(targets.numpy(), predicted, average=reduction)
    assert value == pytest.approx(expected, rel=1e-5)
    last = reference(targets[-7:].numpy(), predicted[-7:], average=reduction)
    assert float(values[-1].value) == pytest.approx(last, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
def test_multiclass_absent_classes(drive, kind, reduction):
    """Class 5 is never a target nor predicted (left out of the macro mean, as sklearn
    does); class 4 is predicted but never a target (it counts, with precision 0)."""
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(N, 6, generator=g)
    logits[:, 5] = -1e4
    targets = torch.randint(0, 4, (N,), generator=g)
    value, _ = drive(_make(kind, "multiclass", reduction=reduction), _batches(logits, targets))
    predicted = logits.argmax(-1).numpy()
    assert (predicted == 4).any()
    expected = _reference(kind)(targets.numpy(), predicted, average=reduction)
    assert value == pytest.approx(expected, rel=1e-5)


def _refined_top_k(logits: torch.Tensor, targets: torch.Tensor, k: int) -> np.ndarray:
    """One prediction per sample: the target if it is among the top k, else the top-1."""
    top = np.argsort(-logits.numpy(), axis=1, kind="stable")[:, :k]
    y = targets.numpy()
    hit = (top == y[:, None]).any(axis=1)
    return np.where(hit, y, top[:, 0])


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
def test_multiclass_top_k(drive, kind, reduction):
    from torchmetrics.classification import (
        MulticlassFBetaScore,
        MulticlassPrecision,
        MulticlassRecall,
    )

    logits, targets = _multiclass_data(14, classes=6)
    metric = _make(kind, "multiclass", top_k=2, reduction=reduction)
    value, _ = drive(metric, _batches(logits, targets))
    expected = _reference(kind)(
        targets.numpy(), _refined_top_k(logits, targets, 2), average=reduction
    )
    assert value == pytest.approx(expected, rel=1e-5)
    label, _, beta, _ = kind
    options = dict(num_classes=6, top_k=2, average=reduction)
    if label == "precision":
        reference = MulticlassPrecision(**options)
    elif label == "recall":
        reference = MulticlassRecall(**options)
    else:
        reference = MulticlassFBetaScore(beta=beta, **options)
    assert value == pytest.approx(float(reference(logits, targets)), rel=1e-5)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
@pytest.mark.parametrize("pad", [0, -100])
def test_multiclass_sequence_padding(drive, kind, reduction, pad):
    g = torch.Generator().manual_seed(15)
    vocab, length = 6, 5
    logits = torch.randn(N, length, vocab, generator=g)
    targets = torch.randint(0, vocab, (N, length), generator=g)
    targets[torch.rand(N, length, generator=g) < 0.3] = pad
    outputs = [
        SequenceOutput(ZERO, x, y, pad_token=pad)
        for x, y in zip(logits.split(SIZES), targets.split(SIZES))
    ]
    value, values = drive(_make(kind, "multiclass", reduction=reduction), outputs)
    keep = (targets != pad).reshape(-1)
    y = targets.reshape(-1)[keep].numpy()
    predicted = logits.reshape(-1, vocab).argmax(-1)[keep].numpy()
    assert value == pytest.approx(_reference(kind)(y, predicted, average=reduction), rel=1e-5)
    assert sum(int(v.weight) for v in values) == int(keep.sum())


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
@pytest.mark.parametrize("threshold", [0.5, 0.7])
def test_multilabel(drive, kind, reduction, threshold):
    g = torch.Generator().manual_seed(16)
    scores = torch.rand(N, 6, generator=g)
    targets = (torch.rand(N, 6, generator=g) < 0.4).long()
    targets[:, 5] = 0  # a label never positive: counts as 0 in the macro mean (sklearn)
    metric = _make(kind, "multilabel", threshold=threshold, reduction=reduction)
    outputs = _batches(scores, targets, MultiLabelClassificationOutput)
    warmup = _batches(scores.flip(0), targets, MultiLabelClassificationOutput)
    value, values = drive(metric, outputs, warmup=warmup)
    predicted = (scores > threshold).long().numpy()
    reference = _reference(kind)
    expected = reference(targets.numpy(), predicted, average=reduction)
    assert value == pytest.approx(expected, rel=1e-5)
    first = reference(targets[:32].numpy(), predicted[:32], average=reduction)
    assert float(values[0].value) == pytest.approx(first, rel=1e-5, abs=1e-7)


def test_wrong_shapes_and_options():
    with pytest.raises(ConfigError):
        PrecisionMetric.multiclass(reduction="weighted")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        RecallMetric.multiclass(top_k=0)
    with pytest.raises(ConfigError):
        FBetaScoreMetric.binary(beta=0.0)
    meta = None
    with pytest.raises(TrainingError, match="multiclass"):
        PrecisionMetric.binary().update(
            ClassificationInput(torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), meta
        )
    with pytest.raises(TrainingError, match="binary"):
        PrecisionMetric.multiclass().update(
            ClassificationInput(torch.rand(4), torch.zeros(4, dtype=torch.long)), meta
        )


def test_epoch_value_without_updates_is_nan():
    metric = RecallMetric.multiclass()
    metric.clear()
    assert np.isnan(float(metric.epoch_value()))
