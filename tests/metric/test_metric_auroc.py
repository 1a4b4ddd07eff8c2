"""AUROC (binary, one-vs-rest multiclass, multi-label) against scikit-learn."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from ember.errors import TrainingError
from ember.train.metric.auroc import AurocMetric, rank_auroc
from ember.train.metric.inputs import ScoresInput
from ember.train.output import ClassificationOutput, MultiLabelClassificationOutput

SIZES = [32, 32, 32, 7]
N = sum(SIZES)
ZERO = torch.tensor(0.0)


def _batches(output, targets, cls=ClassificationOutput):
    return [cls(ZERO, x, y) for x, y in zip(output.split(SIZES), targets.split(SIZES))]


@pytest.mark.parametrize("shape", ["[N]", "[N,1]", "[N,2]"])
@pytest.mark.parametrize("ties", [False, True])
def test_binary(drive, shape, ties):
    g = torch.Generator().manual_seed(20)
    targets = torch.randint(0, 2, (N,), generator=g)
    if shape == "[N,2]":
        output = torch.randn(N, 2, generator=g) + targets.unsqueeze(-1) * torch.tensor([0.0, 0.8])
        if ties:
            output = output.round()
        scores = output.double().softmax(-1)[:, 1]
    else:
        scores = torch.rand(N, generator=g) * 0.6 + targets * 0.4
        if ties:
            scores = (scores * 5).round() / 5
        output = scores.unsqueeze(-1) if shape == "[N,1]" else scores
    metric = AurocMetric()
    warmup = _batches(output.flip(0), targets)
    value, values = drive(metric, _batches(output, targets), warmup=warmup)
    assert value == pytest.approx(roc_auc_score(targets.numpy(), scores.numpy()), rel=1e-5)
    # The iteration value is the batch's own AUROC.
    first = roc_auc_score(targets[:32].numpy(), scores[:32].numpy())
    assert float(values[0].value) == pytest.approx(first, rel=1e-5)
    assert [int(v.weight) for v in values] == SIZES


@pytest.mark.parametrize("logits", [False, True])
def test_multiclass_one_vs_rest_macro(drive, logits):
    g = torch.Generator().manual_seed(21)
    classes = 5
    targets = torch.randint(0, classes, (N,), generator=g)
    raw = torch.randn(N, classes, generator=g) + torch.nn.functional.one_hot(targets, classes)
    probabilities = raw.double().softmax(-1)
    output = raw if logits else probabilities.float()
    value, _ = drive(AurocMetric(), _batches(output, targets))
    expected = roc_auc_score(
        targets.numpy(), probabilities.numpy(), multi_class="ovr", average="macro"
    )
    assert value == pytest.approx(expected, rel=1e-5)


def test_multilabel_macro(drive):
    g = torch.Generator().manual_seed(22)
    targets = (torch.rand(N, 4, generator=g) < 0.4).long()
    scores = ((torch.rand(N, 4, generator=g) + 0.5 * targets) * 4).round() / 6  # with ties
    outputs = _batches(scores, targets, MultiLabelClassificationOutput)
    value, values = drive(AurocMetric(), outputs)
    assert value == pytest.approx(roc_auc_score(targets.numpy(), scores.numpy()), rel=1e-5)
    first = roc_auc_score(targets[:32].numpy(), scores[:32].numpy())
    assert float(values[0].value) == pytest.approx(first, rel=1e-5)


def test_padding_is_left_out(drive):
    g = torch.Generator().manual_seed(23)
    classes = 4
    targets = torch.randint(0, classes, (N,), generator=g)
    signal = 1.5 * torch.nn.functional.one_hot(targets)
    scores = (torch.randn(N, classes, generator=g) + signal).softmax(-1)
    targets[torch.rand(N, generator=g) < 0.25] = -1
    items = [
        ScoresInput(x, y, pad_token=-1) for x, y in zip(scores.split(SIZES), targets.split(SIZES))
    ]
    value, values = drive(AurocMetric(), items)
    keep = targets != -1
    expected = roc_auc_score(
        targets[keep].numpy(), scores[keep].double().numpy(), multi_class="ovr", average="macro"
    )
    assert value == pytest.approx(expected, rel=1e-5)
    assert sum(int(v.weight) for v in values) == int(keep.sum())


def test_undefined_columns_are_skipped():
    scores = torch.tensor([[0.1, 0.9], [0.4, 0.2], [0.8, 0.7]])
    positive = torch.tensor([[False, True], [True, True], [True, True]])
    # Column 1 has no negatives: the value is column 0's AUROC alone.
    assert float(rank_auroc(scores, positive)) == pytest.approx(
        roc_auc_score([0, 1, 1], [0.1, 0.4, 0.8])
    )
    assert math.isnan(float(rank_auroc(scores, torch.ones(3, 2, dtype=torch.bool))))


def test_empty_epoch_and_bad_shape():
    metric = AurocMetric()
    metric.clear()
    assert math.isnan(float(metric.epoch_value()))
    with pytest.raises(TrainingError):
        metric.update(ScoresInput(torch.rand(2, 3, 4), torch.zeros(2, dtype=torch.long)), None)
