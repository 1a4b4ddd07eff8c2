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
    assert values[0].resolve()[0] == pytest.approx(first, rel=1e-5)


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


def _eleven(pad: int | None = None) -> ClassificationInput:
    """11 samples, 4 classes: the target is the top class for 7, second for 3, last for 1."""
    targets = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2])
    order = torch.tensor([[0, 1, 2, 3]] * 11)  # class ranks per sample, best first
    rank_of_target = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 3])
    for i, rank in enumerate(rank_of_target.tolist()):
        classes = [c for c in range(4) if c != int(targets[i])]
        classes.insert(rank, int(targets[i]))
        order[i] = torch.tensor(classes)
    logits = torch.empty(11, 4)
    logits.scatter_(1, order, torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 11))
    if pad is not None:
        targets = targets.clone()
        targets[[0, 8]] = pad  # one top-1 hit and one top-2 hit left out
    return ClassificationInput(logits, targets, pad_token=pad)


def test_top_1_accuracy_is_the_same_float_as_accuracy(drive):
    for item in (_eleven(), _eleven(pad=-1)):
        top1 = TopKAccuracyMetric(1).update(item, None).resolve()
        accuracy = AccuracyMetric().update(item, None).resolve()
        assert top1 == accuracy
    assert TopKAccuracyMetric(1).update(_eleven(), None).resolve() == (700 / 11, 11.0)
    # And the epoch values, through the loop's weighted mean.
    _, _, outputs = _classification(10)
    assert drive(TopKAccuracyMetric(1), outputs)[0] == drive(AccuracyMetric(), outputs)[0]


@pytest.mark.parametrize(("k", "correct"), [(2, 10), (3, 10), (4, 11)])
def test_top_k_accuracy_is_exact_in_float64(k, correct):
    value, weight = TopKAccuracyMetric(k).update(_eleven(), None).resolve()
    assert weight == 11.0
    assert value == 100.0 * correct / 11  # the correctly rounded ratio, not a close one
    # Padding leaves out one top-1 hit and one top-2 hit.
    value, weight = TopKAccuracyMetric(k).update(_eleven(pad=-1), None).resolve()
    assert (value, weight) == (100.0 * (correct - 2) / 9, 9.0)


def test_top_k_accuracy_is_not_rounded_to_float32():
    value, _ = TopKAccuracyMetric(2).update(_eleven(), None).resolve()
    assert value == 1000 / 11 == 90.9090909090909
    assert value != float(torch.tensor(1000 / 11, dtype=torch.float32))  # 90.90909576416016
