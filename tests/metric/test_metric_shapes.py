"""Every built-in metric checks its inputs: wrong shapes (at every update) and wrong
values (on the first update of an epoch) raise a `TrainingError` naming the metric,
what it got and what it reads, on their own and in a training run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Classifier
from sklearn.metrics import accuracy_score, precision_score, roc_auc_score

from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import (
    AccuracyMetric,
    AurocMetric,
    ClassificationInput,
    FBetaScoreMetric,
    HammingScoreMetric,
    LossInput,
    LossMetric,
    MetricMetadata,
    MultiLabelInput,
    PerplexityMetric,
    PrecisionMetric,
    RecallMetric,
    ScoresInput,
    SequenceInput,
    TopKAccuracyMetric,
    TorchMetric,
)

META = MetricMetadata("train", 1, 1, 1, 1, 1e-3)
G = torch.Generator().manual_seed(60)
LOGITS = torch.randn(32, 4, generator=G)
CLASSES = torch.randint(0, 4, (32,), generator=G)
SCORES = torch.rand(32, generator=G)
BINARY = torch.randint(0, 2, (32,), generator=G)
LABEL_SCORES = torch.rand(32, 4, generator=G)
LABELS = (torch.rand(32, 4, generator=G) < 0.4).long()
TOKEN_LOGITS = torch.randn(2, 5, 7, generator=G)
TOKENS = torch.randint(0, 7, (2, 5), generator=G)


def classification(output: torch.Tensor, targets: torch.Tensor, **kw: Any) -> ClassificationInput:
    return ClassificationInput(output, targets, **kw)


# (metric, input, phrases the message must hold besides the metric and the shapes)
WRONG_SHAPES: list[tuple[Any, Any, list[str]]] = [
    # The broadcasting case: [32, 4] against [32, 1] used to give 456 %.
    (AccuracyMetric(), classification(LOGITS, CLASSES[:, None]), ["targets.view(-1)"]),
    (AccuracyMetric(), classification(LOGITS, F.one_hot(CLASSES, 4)), ["not one-hot"]),
    (AccuracyMetric(), classification(LOGITS, CLASSES[:16]), ["32 and 16 rows"]),
    (AccuracyMetric(), classification(LOGITS, CLASSES.float()), ["targets.long()"]),
    (AccuracyMetric(), classification(LOGITS[None], CLASSES[None]), ["flatten"]),
    (AccuracyMetric(), classification(SCORES, F.one_hot(BINARY, 2)), ["one-hot or multi-label"]),
    (AccuracyMetric(), classification(SCORES[:, None], BINARY[:20]), ["32 and 20 rows"]),
    (TopKAccuracyMetric(3), classification(LOGITS, CLASSES[:, None]), ["targets.view(-1)"]),
    (TopKAccuracyMetric(3), classification(SCORES, BINARY), ["one score per class"]),
    (TopKAccuracyMetric(3), classification(LOGITS, CLASSES[:8]), ["32 and 8 rows"]),
    (PrecisionMetric.binary(), classification(LOGITS, CLASSES), ["multiclass()"]),
    (PrecisionMetric.binary(), classification(SCORES, F.one_hot(BINARY, 2)), ["multiclass"]),
    (RecallMetric.binary(), classification(SCORES, BINARY[:31]), ["32 and 31 rows"]),
    (FBetaScoreMetric.binary(), classification(LOGITS[:, :2], BINARY[:4]), ["32 and 4 rows"]),
    (RecallMetric.multiclass(), classification(LOGITS, CLASSES[:, None]), ["targets.view(-1)"]),
    (PrecisionMetric.multiclass(), classification(LOGITS, CLASSES[:16]), ["32 and 16 rows"]),
    (FBetaScoreMetric.multiclass(), classification(SCORES, BINARY), ["binary()"]),
    (FBetaScoreMetric.multiclass(2.0), classification(LOGITS, CLASSES * 1.0), ["long()"]),
    (FBetaScoreMetric.multilabel(), MultiLabelInput(LABEL_SCORES, CLASSES), ["class indices"]),
    (PrecisionMetric.multilabel(), MultiLabelInput(LABEL_SCORES, LABELS[:, :3]), ["columns"]),
    (RecallMetric.multilabel(), MultiLabelInput(LABEL_SCORES, LABELS[:30]), ["32 and 30 rows"]),
    (HammingScoreMetric(), MultiLabelInput(LABEL_SCORES, CLASSES), ["class indices"]),
    (HammingScoreMetric(), MultiLabelInput(LABEL_SCORES, LABELS[:, :2]), ["columns"]),
    (AurocMetric(), ScoresInput(SCORES, BINARY[:16]), ["32 and 16 rows"]),
    (AurocMetric(), ScoresInput(SCORES, F.one_hot(BINARY, 2)), ["multiclass"]),
    (AurocMetric(), ScoresInput(LOGITS, CLASSES[:, None]), ["targets.view(-1)"]),
    (AurocMetric(), ScoresInput(LOGITS, F.one_hot(CLASSES, 4)), ["not one-hot"]),
    (AurocMetric(), ScoresInput(LOGITS, CLASSES.float()), ["long()"]),
    (AurocMetric(), ScoresInput(LOGITS[None], CLASSES[None]), ["flatten"]),
    (AurocMetric(), ScoresInput(LABEL_SCORES, LABELS[:, :3], multilabel=True), ["columns"]),
    (AurocMetric(), ScoresInput(LABEL_SCORES, CLASSES, multilabel=True), ["class indices"]),
    (PerplexityMetric(), SequenceInput(TOKEN_LOGITS, TOKENS[:, :4]), ["[2, 5]"]),
    (PerplexityMetric(), SequenceInput(TOKEN_LOGITS, F.one_hot(TOKENS, 7)), ["token ids"]),
    (PerplexityMetric(), SequenceInput(TOKEN_LOGITS, TOKENS.float()), ["long()"]),
    (PerplexityMetric(), SequenceInput(TOKEN_LOGITS[0, 0], TOKENS[0, :1]), ["vocabulary"]),
    (LossMetric(), LossInput(torch.rand(32), 32), ["loss.mean()"]),
]


def _shapes(item: Any) -> list[tuple[int, ...]]:
    tensors = [v for v in vars(item).values() if isinstance(v, torch.Tensor)]
    return [tuple(t.shape) for t in tensors]


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


@pytest.mark.parametrize(
    "metric, item, phrases",
    WRONG_SHAPES,
    ids=[f"{m.name}-{i}" for i, (m, _, _) in enumerate(WRONG_SHAPES)],
)
def test_wrong_shapes_raise_a_training_error_naming_the_metric_and_the_shapes(
    metric, item, phrases
):
    metric.clear()
    with pytest.raises(TrainingError) as error:
        metric.update(item, META)
    message = str(error.value)
    assert type(metric).__name__ in message
    assert metric.name in message
    for shape in _shapes(item):
        assert _dims(shape) in message
    assert " reads " in message  # what the metric expects
    for phrase in phrases:
        assert phrase in message


def test_the_accuracy_message_says_what_it_reads_and_how_to_fix_it():
    with pytest.raises(TrainingError) as error:
        AccuracyMetric().update(classification(LOGITS, CLASSES[:, None]), META)
    assert str(error.value) == (
        "AccuracyMetric reads outputs [N, C] and class-index targets [N]; got outputs "
        "[32, 4] and targets [32, 1]: squeeze the targets (targets.view(-1)) to one class "
        "index per row."
    )


def test_shapes_are_checked_at_every_update_not_only_the_first():
    metric = AccuracyMetric()
    metric.clear()
    metric.update(classification(LOGITS, CLASSES), META)
    with pytest.raises(TrainingError, match=r"targets \[32, 1\]"):
        metric.update(classification(LOGITS, CLASSES[:, None]), META)


# Values: checked on the first update after clear(), in one read from the device.
WRONG_VALUES: list[tuple[Any, Any, str]] = [
    (
        AccuracyMetric(),
        classification(LOGITS, CLASSES + 1),
        r"\[0, 4\) for outputs \[32, 4\].*1 to 4",
    ),
    (AccuracyMetric(), classification(LOGITS, CLASSES - 1), r"from -1 to 2.*pad_token"),
    (AccuracyMetric(), classification(SCORES, BINARY * 3), r"0 or 1; .*from 0 to 3"),
    (AccuracyMetric(), classification(SCORES, BINARY * 0.8), r"0 or 1"),
    (TopKAccuracyMetric(2), classification(LOGITS, CLASSES + 4), r"\[0, 4\).*from 4 to 7"),
    (PrecisionMetric.binary(), classification(SCORES, CLASSES), r"in \[0, 1\].*multiclass"),
    (RecallMetric.binary(), classification(LOGITS[:, :2], CLASSES), r"in \[0, 1\]"),
    (RecallMetric.multiclass(), classification(LOGITS, CLASSES * 2), r"\[0, 4\).*to 6"),
    (FBetaScoreMetric.multilabel(), MultiLabelInput(LABEL_SCORES, LABELS * 2), r"in \[0, 1\]"),
    (HammingScoreMetric(), MultiLabelInput(LABEL_SCORES, LABELS - 1), r"from -1 to 0"),
    (AurocMetric(), ScoresInput(SCORES, CLASSES), r"in \[0, 1\]"),
    (AurocMetric(), ScoresInput(LOGITS, CLASSES + 1), r"\[0, 4\)"),
    (AurocMetric(), ScoresInput(LABEL_SCORES, LABELS + 1, multilabel=True), r"in \[0, 1\]"),
    (PerplexityMetric(), SequenceInput(TOKEN_LOGITS, TOKENS + 3), r"\[0, 7\).*pad_token"),
]


@pytest.mark.parametrize(
    "metric, item, pattern",
    WRONG_VALUES,
    ids=[f"{m.name}-{i}" for i, (m, _, _) in enumerate(WRONG_VALUES)],
)
def test_wrong_values_raise_on_the_first_update_of_an_epoch(metric, item, pattern):
    metric.clear()
    with pytest.raises(TrainingError, match=pattern) as error:
        metric.update(item, META)
    assert type(metric).__name__ in str(error.value)
    assert metric.name in str(error.value)


def test_multiclass_precision_with_a_class_out_of_range_is_an_error_not_a_crash():
    """index_add_ with an index out of range would raise a bare IndexError on the CPU
    and abort the whole CUDA context on a GPU."""
    metric = PrecisionMetric.multiclass()
    metric.clear()
    with pytest.raises(TrainingError, match=r"PrecisionMetric.multiclass\(\) reads class"):
        metric.update(classification(LOGITS, torch.full((32,), 9)), META)


def test_values_are_checked_again_after_clear():
    metric = TopKAccuracyMetric(2)
    metric.clear()
    metric.update(classification(LOGITS, CLASSES), META)
    metric.clear()  # a new epoch
    with pytest.raises(TrainingError, match=r"\[0, 4\)"):
        metric.update(classification(LOGITS, CLASSES + 1), META)


def test_padding_is_left_out_of_the_value_checks():
    targets = CLASSES.clone()
    targets[::3] = -100
    item = classification(LOGITS, targets, pad_token=-100)
    for metric in (AccuracyMetric(), TopKAccuracyMetric(2), RecallMetric.multiclass()):
        metric.clear()
        metric.update(item, META)
    tokens = TOKENS.clone()
    tokens[:, -2:] = -1
    metric = PerplexityMetric(pad_token=-1)
    metric.clear()
    metric.update(SequenceInput(TOKEN_LOGITS, tokens), META)


@pytest.mark.parametrize(
    "metric, kind",
    [(RecallMetric.multiclass(), ClassificationInput), (AurocMetric(), ScoresInput)],
    ids=["Recall", "AUROC"],
)
def test_the_number_of_classes_stays_the_same_all_epoch(metric, kind):
    metric.clear()
    metric.update(kind(LOGITS, CLASSES), META)
    with pytest.raises(TrainingError, match=r"same number of output columns") as error:
        metric.update(kind(LOGITS[:, :3], CLASSES.clamp(max=2)), META)
    assert "[32, 3]" in str(error.value)


def test_binary_targets_of_one_column_are_read_as_targets_of_one_row(drive):
    """Scores [N, 1] against targets [N, 1] (as BCEWithLogitsLoss takes them) give the
    figures of scores and targets [N], not those of an [N, N] broadcast."""
    scores, targets = SCORES[:, None], BINARY[:, None].float()
    predicted = (SCORES > 0.5).long().numpy()
    items = [ClassificationOutput(torch.tensor(0.0), scores, targets)]
    accuracy, _ = drive(AccuracyMetric(), items)
    assert accuracy == pytest.approx(100 * accuracy_score(BINARY.numpy(), predicted), rel=1e-12)
    precision, _ = drive(PrecisionMetric.binary(), items)
    assert precision == pytest.approx(precision_score(BINARY.numpy(), predicted), rel=1e-12)
    auroc, _ = drive(AurocMetric(), items)
    assert auroc == pytest.approx(roc_auc_score(BINARY.numpy(), SCORES.numpy()), rel=1e-6)


def test_the_loss_may_be_a_number_or_a_tensor_of_one_element():
    assert LossMetric().update(LossInput(torch.tensor([0.25]), 4), META).resolve() == (0.25, 4.0)
    assert LossMetric().update(LossInput(0.5, 2), META).resolve() == (0.5, 2.0)  # type: ignore[arg-type]
    value = LossMetric().update(LossInput(torch.tensor(0.75), 3), META).value
    assert isinstance(value, torch.Tensor) and value.dim() == 0


def test_a_torchmetrics_error_names_the_metric_and_the_shapes():
    from torchmetrics.classification import MulticlassAccuracy

    metric = TorchMetric(MulticlassAccuracy(num_classes=4), name="Torch Accuracy")
    with pytest.raises(TrainingError) as error:
        metric.update(classification(LOGITS, CLASSES[:16]), META)
    message = str(error.value)
    assert "'Torch Accuracy' (MulticlassAccuracy)" in message
    assert "outputs [32, 4] float32 and targets [16] int64" in message


# Through a training run: targets [B, 1] against logits [B, C] fail before any step.
class ColumnTargets(Classifier):
    """The blob classifier, whose outputs carry the targets as a column [B, 1]."""

    def column(self, batch: Any) -> ClassificationOutput:
        logits = self(batch.inputs)
        loss = F.cross_entropy(logits, batch.targets)
        return ClassificationOutput(loss, logits, batch.targets.unsqueeze(1))

    def train_step(self, batch: Any) -> TrainOutput:
        return TrainOutput(self.column(batch))

    def valid_step(self, batch: Any) -> ClassificationOutput:
        return self.column(batch)


COLUMN_ERROR = (
    r"AccuracyMetric reads outputs \[N, C\] and class-index targets \[N\]; got outputs "
    r"\[32, 3\] and targets \[32, 1\]: squeeze the targets \(targets.view\(-1\)\)"
)


@pytest.mark.parametrize("split", ["train", "valid"])
def test_a_run_with_column_targets_fails_before_the_first_optimizer_step(
    tmp_path, loaders, quiet, split
):
    model = ColumnTargets()
    before = [p.detach().clone() for p in model.parameters()]
    builder = LearnerBuilder(tmp_path).metric_train(LossMetric())
    builder = (
        builder.metric_train(AccuracyMetric())
        if split == "train"
        else builder.metric_valid(AccuracyMetric())
    )
    learner = (
        builder.devices(["cpu"])
        .num_epochs(1)
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match=COLUMN_ERROR):
        learner.fit(*loaders)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "targets [32, 1]" in (tmp_path / "experiment.log").read_text()
    assert not (tmp_path / "train").exists()  # not one training batch was logged
