"""Accuracy, top-k accuracy and loss against scikit-learn, padding included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, log_loss, top_k_accuracy_score

from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.inputs import ClassificationInput
from ember.train.metric.loss import LossMetric
from ember.train.metric.topk import TopKAccuracyMetric
from ember.train.output import ClassificationOutput, SequenceOutput

SIZES = [32, 32, 32, 7]
CLASSES = 5


def _classification(seed: int, classes: int = CLASSES):
    g = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    logits = torch.randn(n, classes, generator=g)
    targets = torch.randint(0, classes, (n,), generator=g)
    outputs = [
        ClassificationOutput(F.cross_entropy(x, y), x, y)
        for x, y in zip(logits.split(SIZES), targets.split(SIZES))
    ]
    return logits, targets, outputs


def _sequences(seed: int, pad: int, vocab: int = 7, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    logits = torch.randn(n, length, vocab, generator=g)
    targets = torch.randint(0, vocab, (n, length), generator=g)
    targets[torch.rand(n, length, generator=g) < 0.3] = pad
    outputs = [
        SequenceOutput(torch.tensor(0.0), x, y, pad_token=pad)
        for x, y in zip(logits.split(SIZES), targets.split(SIZES))
    ]
    return logits, targets, outputs


def test_accuracy_multiclass(drive):
    logits, targets, outputs = _classification(0)
    value, values = drive(AccuracyMetric(), outputs, warmup=_classification(1)[2])
    expected = 100.0 * accuracy_score(targets.numpy(), logits.argmax(-1).numpy())
    assert value == pytest.approx(expected, rel=1e-5)
    assert [int(v.weight) for v in values] == SIZES


def test_accuracy_binary_scores(drive):
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(sum(SIZES), generator=g)
    targets = torch.randint(0, 2, (sum(SIZES),), generator=g)
    outputs = [
        ClassificationOutput(torch.tensor(0.0), s, t)
        for s, t in zip(scores.split(SIZES), targets.split(SIZES))
    ]
    value, _ = drive(AccuracyMetric(), outputs)
    expected = 100.0 * accuracy_score(targets.numpy(), (scores > 0.5).long().numpy())
    assert value == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("pad", [0, -100])
def test_accuracy_sequence_padding(drive, pad):
    logits, targets, outputs = _sequences(3, pad)
    value, values = drive(AccuracyMetric(), outputs)
    keep = (targets != pad).reshape(-1)
    predicted = logits.argmax(-1).reshape(-1)[keep]
    expected = 100.0 * accuracy_score(targets.reshape(-1)[keep].numpy(), predicted.numpy())
    assert value == pytest.approx(expected, rel=1e-5)
    assert sum(int(v.weight) for v in values) == int(keep.sum())


def test_accuracy_own_pad_token(drive):
    logits, targets, _ = _classification(4)
    targets = targets.clone()
    targets[::5] = -1
    items = [ClassificationInput(x, y) for x, y in zip(logits.split(SIZES), targets.split(SIZES))]
    value, _ = drive(AccuracyMetric(pad_token=-1), items)
    keep = targets != -1
    expected = 100.0 * accuracy_score(targets[keep].numpy(), logits.argmax(-1)[keep].numpy())
    assert value == pytest.approx(expected, rel=1e-5)


@pytest.mark.filterwarnings("ignore:.*greater than or equal to .n_classes.")
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_top_k_accuracy(drive, k):
    logits, targets, outputs = _classification(5)
    metric = TopKAccuracyMetric(k)
    value, values = drive(metric, outputs, warmup=_classification(6)[2])
    expected = 100.0 * top_k_accuracy_score(
        targets.numpy(), logits.numpy(), k=min(k, CLASSES), labels=np.arange(CLASSES)
    )
    assert metric.name == f"Top-{k} Accuracy"
    assert value == pytest.approx(expected, rel=1e-5)
    # Each iteration value is the batch's own top-k accuracy.
    first = 100.0 * top_k_accuracy_score(
        targets[:32].numpy(), logits[:32].numpy(), k=min(k, CLASSES), labels=np.arange(CLASSES)
    )
    assert float(values[0].value) == pytest.approx(first, rel=1e-5)


@pytest.mark.parametrize("pad", [0, -100])
def test_top_k_accuracy_padding(drive, pad):
    vocab = 7
    logits, targets, outputs = _sequences(7, pad, vocab=vocab)
    value, _ = drive(TopKAccuracyMetric(3), outputs)
    keep = (targets != pad).reshape(-1)
    expected = 100.0 * top_k_accuracy_score(
        targets.reshape(-1)[keep].numpy(),
        logits.reshape(-1, vocab)[keep].numpy(),
        k=3,
        labels=np.arange(vocab),
    )
    assert value == pytest.approx(expected, rel=1e-5)


def test_loss_is_exact_sample_mean(drive):
    logits, targets, outputs = _classification(8)
    value, values = drive(LossMetric(), outputs, warmup=_classification(9)[2])
    expected = log_loss(targets.numpy(), logits.double().softmax(-1).numpy(), labels=range(CLASSES))
    assert value == pytest.approx(expected, rel=1e-5)
    assert [int(v.weight) for v in values] == SIZES
