"""Binary and multi-label metrics read probabilities, or logits with `from_logits=True`;
logits given as probabilities are refused, on their own and in a training run."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Classifier
from sklearn.metrics import (
    accuracy_score,
    fbeta_score,
    hamming_loss,
    precision_score,
    recall_score,
    roc_auc_score,
)

from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder, MultiLabelClassificationOutput, TrainOutput
from ember.train.metric import (
    AccuracyMetric,
    AurocMetric,
    ClassificationInput,
    FBetaScoreMetric,
    HammingScoreMetric,
    LossMetric,
    MetricMetadata,
    MultiLabelInput,
    PrecisionMetric,
    RecallMetric,
    ScoresInput,
)
from ember.train.output import ClassificationOutput

SIZES = [32, 32, 32, 7]
N = sum(SIZES)
ZERO = torch.tensor(0.0)
META = MetricMetadata("valid", 1, 1, 1, 1, None)
LOGITS_ERROR = r"look like logits.*from_logits=True"

# (label, metric class, beta or None, sklearn function)
KINDS = [
    ("precision", PrecisionMetric, None, precision_score),
    ("recall", RecallMetric, None, recall_score),
    ("f1", FBetaScoreMetric, 1.0, partial(fbeta_score, beta=1.0)),
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


def _binary_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 2, (N,), generator=g)
    return torch.randn(N, generator=g) * 3 + targets, targets


def _multilabel_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    targets = (torch.rand(N, 5, generator=g) < 0.4).long()
    return torch.randn(N, 5, generator=g) * 3 + targets, targets


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("shape", ["[N]", "[N,1]"])
@pytest.mark.parametrize("threshold", [0.5, 0.8])
def test_binary_logits_equal_sigmoid_probabilities(drive, kind, shape, threshold):
    logits, targets = _binary_data(1)
    probabilities = logits.sigmoid()
    if shape == "[N,1]":
        logits, probabilities = logits.unsqueeze(-1), probabilities.unsqueeze(-1)
    from_logits, values = drive(
        _make(kind, "binary", threshold=threshold, from_logits=True), _batches(logits, targets)
    )
    from_probabilities, _ = drive(
        _make(kind, "binary", threshold=threshold), _batches(probabilities, targets)
    )
    assert from_logits == from_probabilities
    predicted = (probabilities.reshape(-1) > threshold).long().numpy()
    expected = _reference(kind)(targets.numpy(), predicted)
    assert from_logits == pytest.approx(expected, rel=1e-12)
    assert 0 < from_logits < 1
    assert [int(v.weight) for v in values] == SIZES


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("reduction", ["macro", "micro"])
def test_multilabel_logits_equal_sigmoid_probabilities(drive, kind, reduction):
    logits, targets = _multilabel_data(2)
    outputs = _batches(logits, targets, MultiLabelClassificationOutput)
    metric = _make(kind, "multilabel", reduction=reduction, from_logits=True)
    from_logits, _ = drive(metric, outputs)
    probabilities = _batches(logits.sigmoid(), targets, MultiLabelClassificationOutput)
    from_probabilities, _ = drive(_make(kind, "multilabel", reduction=reduction), probabilities)
    assert from_logits == from_probabilities
    predicted = (logits > 0).long().numpy()  # sigmoid(x) > 0.5 exactly when x > 0
    expected = _reference(kind)(targets.numpy(), predicted, average=reduction)
    assert from_logits == pytest.approx(expected, rel=1e-12)


def test_hamming_score_of_logits(drive):
    logits, targets = _multilabel_data(3)
    outputs = _batches(logits, targets, MultiLabelClassificationOutput)
    value, _ = drive(HammingScoreMetric(from_logits=True), outputs)
    probabilities = _batches(logits.sigmoid(), targets, MultiLabelClassificationOutput)
    assert value == drive(HammingScoreMetric(), probabilities)[0]
    expected = 100.0 * (1.0 - hamming_loss(targets.numpy(), (logits > 0).long().numpy()))
    assert value == pytest.approx(expected, rel=1e-12)


def test_binary_accuracy_of_logits(drive):
    logits, targets = _binary_data(4)
    value, _ = drive(AccuracyMetric(from_logits=True), _batches(logits, targets))
    assert value == drive(AccuracyMetric(), _batches(logits.sigmoid(), targets))[0]
    expected = 100.0 * accuracy_score(targets.numpy(), (logits > 0).long().numpy())
    assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("multilabel", [False, True])
def test_auroc_of_logits(drive, multilabel):
    logits, targets = _multilabel_data(5) if multilabel else _binary_data(5)
    cls = MultiLabelClassificationOutput if multilabel else ClassificationOutput
    value, _ = drive(AurocMetric(from_logits=True), _batches(logits, targets, cls))
    assert value == drive(AurocMetric(), _batches(logits.sigmoid(), targets, cls))[0]
    assert value == pytest.approx(roc_auc_score(targets.numpy(), logits.numpy()), rel=1e-12)


def test_auroc_keeps_large_logits_apart(drive):
    """float32 sigmoids of 20 and 30 are both 1.0; the logits themselves still rank."""
    logits = torch.tensor([-3.0, 20.0, 30.0, 25.0, 1.0, 40.0])
    targets = torch.tensor([0, 0, 1, 0, 1, 1])
    value, _ = drive(AurocMetric(from_logits=True), [ClassificationOutput(ZERO, logits, targets)])
    assert value == roc_auc_score(targets.numpy(), logits.double().numpy())


def test_multiclass_auroc_from_logits_always_takes_the_softmax(drive):
    """Logits that happen to lie in [0, 1] are still logits with `from_logits=True`."""
    g = torch.Generator().manual_seed(6)
    targets = torch.randint(0, 4, (N,), generator=g)
    logits = torch.rand(N, 4, generator=g) * 0.5 + 0.5 * F.one_hot(targets, 4)
    value, _ = drive(AurocMetric(from_logits=True), _batches(logits, targets))
    probabilities = logits.double().softmax(-1).numpy()
    expected = roc_auc_score(targets.numpy(), probabilities, multi_class="ovr", average="macro")
    assert value == pytest.approx(expected, rel=1e-6)


# Metrics that read probabilities by default, with an input holding logits.
def _refusing() -> list[tuple[Any, Any]]:
    binary = ClassificationInput(torch.tensor([2.5, -1.0, 0.3, 0.9]), torch.tensor([1, 0, 0, 1]))
    column = ClassificationInput(binary.output.unsqueeze(-1), binary.targets)
    labels = torch.tensor([[1.2, -0.4], [0.1, 0.7]])
    multilabel = MultiLabelInput(labels, torch.tensor([[1, 0], [0, 1]]))
    return [
        (PrecisionMetric.binary(), binary),
        (RecallMetric.binary(threshold=0.3), column),
        (FBetaScoreMetric.binary(0.5), binary),
        (PrecisionMetric.multilabel(), multilabel),
        (RecallMetric.multilabel(reduction="micro"), multilabel),
        (FBetaScoreMetric.multilabel(), multilabel),
        (HammingScoreMetric(), multilabel),
        (AccuracyMetric(), binary),
        (AurocMetric(), ScoresInput(binary.output, binary.targets)),
        (AurocMetric(), ScoresInput(labels, multilabel.targets, multilabel=True)),
    ]


@pytest.mark.parametrize(
    "metric, item", _refusing(), ids=[f"{m.name}-{i}" for i, (m, _) in enumerate(_refusing())]
)
def test_logits_without_from_logits_are_refused(metric, item):
    metric.clear()
    with pytest.raises(TrainingError, match=LOGITS_ERROR) as error:
        metric.update(item, META)
    message = str(error.value)
    assert metric.name in message
    assert type(metric).__name__ in message  # where to pass from_logits=True


def test_the_error_names_the_constructor_to_change():
    metric = FBetaScoreMetric.multilabel(2.0)
    item = MultiLabelInput(torch.tensor([[3.0, -2.0]]), torch.tensor([[1, 0]]))
    with pytest.raises(TrainingError) as error:
        metric.update(item, META)
    assert "F2 Score reads probabilities in [0, 1]" in str(error.value)
    assert "scores from -2 to 3" in str(error.value)
    assert "Pass from_logits=True to FBetaScoreMetric.multilabel()" in str(error.value)


def test_probabilities_are_checked_again_each_epoch():
    metric = PrecisionMetric.binary()
    targets = torch.tensor([1, 0])
    metric.clear()
    metric.update(ClassificationInput(torch.tensor([0.9, 0.1]), targets), META)
    metric.clear()  # a new epoch
    with pytest.raises(TrainingError, match=LOGITS_ERROR):
        metric.update(ClassificationInput(torch.tensor([4.0, -4.0]), targets), META)


def test_probabilities_of_0_and_1_and_padding_are_accepted():
    metric = PrecisionMetric.binary()
    metric.clear()
    scores = torch.tensor([1.0, 0.0, -7.0, 0.6])  # -7 is the output at a padded position
    item = ClassificationInput(scores, torch.tensor([1, 0, -100, 0]), pad_token=-100)
    assert metric.update(item, META).resolve() == (0.5, 3.0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: PrecisionMetric.binary(from_logits=1),
        lambda: HammingScoreMetric(from_logits="yes"),
        lambda: AurocMetric(from_logits=None),
        lambda: AccuracyMetric(from_logits=0),
    ],
)
def test_from_logits_must_be_a_bool(build):
    with pytest.raises(ConfigError, match="from_logits must be True or False"):
        build()


# Through a training run: a multi-label model trained with BCEWithLogitsLoss.
class MultiLabelClassifier(Classifier):
    """The blob classifier as a multi-label one: label c is "the blob is class c"."""

    def multilabel(self, batch: Any) -> MultiLabelClassificationOutput:
        logits = self(batch.inputs)
        targets = F.one_hot(batch.targets, 3).float()
        loss = F.binary_cross_entropy_with_logits(logits, targets)
        return MultiLabelClassificationOutput(loss, logits, targets)

    def train_step(self, batch: Any) -> TrainOutput:
        return TrainOutput(self.multilabel(batch))

    def valid_step(self, batch: Any) -> MultiLabelClassificationOutput:
        return self.multilabel(batch)


@pytest.mark.parametrize(
    "metric",
    [
        FBetaScoreMetric.multilabel(),
        RecallMetric.multilabel(reduction="micro"),
        HammingScoreMetric(),
        AurocMetric(),
    ],
    ids=lambda m: m.name,
)
def test_a_run_with_logits_as_probabilities_fails_before_the_first_optimizer_step(
    tmp_path, loaders, quiet, metric
):
    model = MultiLabelClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train(LossMetric())
        .metric_train(metric)
        .devices(["cpu"])
        .num_epochs(1)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match=LOGITS_ERROR):
        learner.fit(*loaders)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "from_logits=True" in (tmp_path / "experiment.log").read_text()


def test_a_validation_metric_with_logits_as_probabilities_fails(tmp_path, loaders, quiet):
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid(PrecisionMetric.multilabel())
        .devices(["cpu"])
        .num_epochs(1)
        .renderer(quiet)
        .build(MultiLabelClassifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match=LOGITS_ERROR):
        learner.fit(*loaders)


def test_a_run_with_from_logits_reports_the_scores_of_the_probabilities(
    tmp_path, loaders, blobs, quiet
):
    torch.manual_seed(0)
    model = MultiLabelClassifier()
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train(FBetaScoreMetric.multilabel(from_logits=True))
        .metric_valid(FBetaScoreMetric.multilabel(from_logits=True))
        .metric_valid(HammingScoreMetric(from_logits=True))
        .metric_valid(AurocMetric(from_logits=True))
        .devices(["cpu"])
        .num_epochs(2)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    valid = learner.history[-1][1]["valid"]
    _, dataset = blobs
    with torch.no_grad():
        model.eval()
        probabilities = model(dataset.inputs).sigmoid()
    targets = F.one_hot(dataset.targets, 3).numpy()
    predicted = (probabilities > 0.5).long().numpy()
    assert valid["F1 Score"] == pytest.approx(
        fbeta_score(targets, predicted, beta=1.0, average="macro", zero_division=0), rel=1e-9
    )
    assert valid["Hamming Score"] == pytest.approx(
        100.0 * (1.0 - hamming_loss(targets, predicted)), rel=1e-9
    )
    assert valid["AUROC"] == pytest.approx(roc_auc_score(targets, probabilities.numpy()), rel=1e-6)
    assert 0.5 < valid["F1 Score"] <= 1.0
