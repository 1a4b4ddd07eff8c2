"""MCC, average precision (AUC-PR) and the confusion matrix against scikit-learn."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import average_precision_score, confusion_matrix, matthews_corrcoef
from sklearn.preprocessing import label_binarize

from ember.errors import ConfigError, TrainingError
from ember.train.metric import AucPrMetric, ConfusionMatrixMetric, MccMetric
from ember.train.output import ClassificationOutput, MultiLabelClassificationOutput, SequenceOutput

SIZES = [40, 40, 40, 9]  # an uneven last batch
N = sum(SIZES)
ZERO = torch.tensor(0.0)


def _batches(output, targets, cls=ClassificationOutput):
    return [cls(ZERO, x, y) for x, y in zip(output.split(SIZES), targets.split(SIZES))]


def _macro_ap(y, s):
    """scikit-learn's macro average precision over the columns holding a positive
    (ember leaves classes without one out of the mean; scikit-learn counts them as 0)."""
    kept = [k for k in range(y.shape[1]) if y[:, k].any()]
    return average_precision_score(y[:, kept], s[:, kept], average="macro")


def _per_batch(values, reference, *arrays):
    """Each iteration value against `reference` on its batch's slice of `arrays`."""
    start = 0
    for size, value in zip(SIZES, values):
        part = [a[start : start + size] for a in arrays]
        assert float(value.value) == pytest.approx(reference(*part), rel=1e-5, abs=1e-7)
        start += size


@pytest.mark.parametrize("from_logits", [False, True])
def test_mcc_binary(drive, from_logits):
    g = torch.Generator().manual_seed(1)
    targets = torch.randint(0, 2, (N,), generator=g)
    logits = torch.randn(N, generator=g) + 1.2 * targets - 0.3
    predicted = (logits > 0).long().numpy()
    output = logits if from_logits else logits.sigmoid()
    value, values = drive(
        MccMetric.binary(from_logits=from_logits),
        _batches(output, targets),
        warmup=_batches(output, 1 - targets),
    )
    assert value == pytest.approx(matthews_corrcoef(targets.numpy(), predicted), rel=1e-9)
    _per_batch(values, matthews_corrcoef, targets.numpy(), predicted)


def test_mcc_multiclass_and_confusion_matrix(drive):
    g = torch.Generator().manual_seed(2)
    classes = 4
    targets = torch.randint(0, classes, (N,), generator=g)
    logits = torch.randn(N, classes, generator=g) + 1.5 * torch.nn.functional.one_hot(targets)
    predicted = logits.argmax(-1).numpy()
    value, values = drive(MccMetric.multiclass(), _batches(logits, targets))
    assert value == pytest.approx(matthews_corrcoef(targets.numpy(), predicted), rel=1e-9)
    _per_batch(values, matthews_corrcoef, targets.numpy(), predicted)

    matrix = ConfusionMatrixMetric.multiclass()
    value, values = drive(matrix, _batches(logits, targets))
    expected = confusion_matrix(targets.numpy(), predicted, labels=list(range(classes)))
    assert matrix.matrix().tolist() == expected.tolist()
    assert value == pytest.approx(100.0 * expected.trace() / N)  # its number: accuracy
    assert [int(v.weight) for v in values] == SIZES


def test_binary_confusion_matrix_from_two_class_logits(drive):
    g = torch.Generator().manual_seed(3)
    targets = torch.randint(0, 2, (N,), generator=g)
    logits = torch.randn(N, 2, generator=g)
    matrix = ConfusionMatrixMetric.binary()
    drive(matrix, _batches(logits, targets))
    expected = confusion_matrix(targets.numpy(), logits.argmax(-1).numpy(), labels=[0, 1])
    assert matrix.matrix().tolist() == expected.tolist()


def test_mcc_multilabel_pools_every_decision(drive):
    g = torch.Generator().manual_seed(4)
    targets = (torch.rand(N, 5, generator=g) < 0.4).long()
    scores = (torch.rand(N, 5, generator=g) + 0.4 * targets).clamp(max=1.0)
    batches = _batches(scores, targets, MultiLabelClassificationOutput)
    value, _ = drive(MccMetric.multilabel(), batches)
    expected = matthews_corrcoef(targets.numpy().ravel(), (scores > 0.5).numpy().ravel())
    assert value == pytest.approx(expected, rel=1e-9)


def test_padding_is_left_out_of_the_matrix(drive):
    targets = torch.tensor([[0, 1, 2, -100], [2, 2, -100, -100]])
    logits = torch.nn.functional.one_hot(torch.tensor([[0, 1, 1, 0], [2, 0, 1, 1]]), 3).float()
    matrix = ConfusionMatrixMetric.multiclass()
    value, values = drive(matrix, [SequenceOutput(ZERO, logits, targets, pad_token=-100)])
    assert value == pytest.approx(100 * 3 / 5)
    # (target, predicted): (0, 0), (1, 1), (2, 1), (2, 2), (2, 0); the padding is dropped
    assert matrix.matrix().tolist() == [[1, 0, 0], [0, 1, 0], [1, 1, 1]]
    assert int(values[0].weight) == 5


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_mcc_undefined_is_zero(drive):
    targets = torch.ones(6, dtype=torch.long)
    value, _ = drive(MccMetric.binary(), [ClassificationOutput(ZERO, torch.ones(6), targets)])
    assert value == 0.0 == matthews_corrcoef(targets.numpy(), targets.numpy())


@pytest.mark.parametrize("ties", [False, True])
def test_average_precision_binary(drive, ties):
    g = torch.Generator().manual_seed(5)
    targets = torch.randint(0, 2, (N,), generator=g)
    scores = torch.rand(N, generator=g) * 0.7 + 0.3 * targets
    if ties:
        scores = (scores * 4).round() / 4
    value, values = drive(AucPrMetric(), _batches(scores, targets))
    y, s = targets.numpy(), scores.double().numpy()
    assert value == pytest.approx(average_precision_score(y, s), rel=1e-6)
    _per_batch(values, average_precision_score, y, s)


@pytest.mark.parametrize("logits", [False, True])
def test_average_precision_multiclass_one_vs_rest_macro(drive, logits):
    g = torch.Generator().manual_seed(6)
    classes = 4
    targets = torch.randint(0, classes, (N,), generator=g)
    raw = torch.randn(N, classes, generator=g) + torch.nn.functional.one_hot(targets)
    probabilities = raw.double().softmax(-1)
    output = raw if logits else probabilities.float()
    value, values = drive(AucPrMetric(from_logits=logits), _batches(output, targets))
    binarized = label_binarize(targets.numpy(), classes=list(range(classes)))
    expected = average_precision_score(binarized, probabilities.numpy(), average="macro")
    assert value == pytest.approx(expected, rel=1e-5)
    _per_batch(values, _macro_ap, binarized, probabilities.numpy())


def test_average_precision_multilabel_with_logits(drive):
    g = torch.Generator().manual_seed(7)
    targets = (torch.rand(N, 3, generator=g) < 0.5).long()
    logits = ((torch.randn(N, 3, generator=g) + targets) * 2).round()  # ties too
    batches = _batches(logits, targets, MultiLabelClassificationOutput)
    value, values = drive(AucPrMetric(from_logits=True), batches)
    expected = average_precision_score(targets.numpy(), logits.numpy(), average="macro")
    assert value == pytest.approx(expected, rel=1e-6)
    _per_batch(values, _macro_ap, targets.numpy(), logits.numpy())


def test_probabilities_are_checked(drive):
    targets = torch.tensor([0, 1, 1])
    with pytest.raises(TrainingError, match="from_logits=True to MccMetric.binary"):
        drive(MccMetric.binary(), [ClassificationOutput(ZERO, torch.tensor([-2.0, 1, 3]), targets)])
    with pytest.raises(TrainingError, match="AucPrMetric"):
        drive(AucPrMetric(), [ClassificationOutput(ZERO, torch.tensor([-2.0, 1, 3]), targets)])


def test_confusion_matrix_has_no_multilabel_mode():
    with pytest.raises(ConfigError, match="mode must be one of"):
        ConfusionMatrixMetric("multilabel")
