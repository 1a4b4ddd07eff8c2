"""The quick readings of the built-in metrics (`ember.train.output.quick_reader`): read
straight from a step output, they give what the metric's `update` gives on the input
the output adapts to, or nothing (and the processor then adapts and updates); a fit
whose metrics read quickly writes the same files as one whose metrics never do."""

from __future__ import annotations

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier, blob_builder

from ember.data import DataLoaderBuilder
from ember.train import (
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
    SequenceOutput,
)
from ember.train import processor as processor_module
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.metric.base import MetricMetadata
from ember.train.output import quick_reader

META = MetricMetadata("train", 1, 1, 1, None, None)
LOSS = torch.tensor(0.75)
SCORES = torch.tensor([[0.1, 2.0, 0.3], [1.5, 0.2, 0.1], [0.0, 0.1, 0.9], [0.3, 0.2, 0.1]])
CLASSES = torch.tensor([1, 0, 1, 0])


def checked(metric):
    """`metric` past its epoch's first-batch checks, as a fit's later steps find it."""
    metric.update(ClassificationOutput(LOSS, SCORES, CLASSES).adapt(metric.input_type), META)
    return metric


def same(quick, general) -> None:
    assert quick is not None
    assert len(quick) == len(general)
    for mine, theirs in zip(quick, general):
        if isinstance(theirs, torch.Tensor):
            assert torch.equal(torch.as_tensor(mine), theirs)
        else:
            assert mine == theirs and type(mine) is type(theirs)


@pytest.mark.parametrize(
    "output",
    [
        ClassificationOutput(LOSS, SCORES, CLASSES),
        ClassificationOutput(LOSS, SCORES.double(), CLASSES.int()),
        RegressionOutput(torch.tensor(2.5), torch.randn(5, 2), torch.randn(5, 2)),
        MultiLabelClassificationOutput(LOSS, torch.randn(3, 4), torch.ones(3, 4)),
    ],
    ids=["classes", "float64-int32", "regression", "multilabel"],
)
def test_the_common_case_reads_as_update_does(output):
    for metric in (AccuracyMetric(), LossMetric()):
        reader = quick_reader(type(output), metric)
        if reader is None:
            assert type(metric) is AccuracyMetric and type(output) is not ClassificationOutput
            continue
        if type(metric) is AccuracyMetric:
            checked(metric)
        same(reader(output), metric.update(output.adapt(metric.input_type), META))


@pytest.mark.parametrize(
    ("metric", "output"),
    [
        (AccuracyMetric(), ClassificationOutput(LOSS, SCORES[:, 0], CLASSES)),  # binary scores
        (AccuracyMetric(), ClassificationOutput(LOSS, SCORES, CLASSES[:3])),  # mismatched
        (AccuracyMetric(), ClassificationOutput(LOSS, SCORES, CLASSES.float())),  # float targets
        (AccuracyMetric(pad_token=0), ClassificationOutput(LOSS, SCORES, CLASSES)),  # padding
        (LossMetric(), ClassificationOutput(LOSS * 4, SCORES, CLASSES, loss_reduction="sum")),
        (LossMetric(), ClassificationOutput(LOSS.reshape(1), SCORES, CLASSES)),  # shape [1]
        (LossMetric(), ClassificationOutput(0.5, SCORES, CLASSES)),  # type: ignore[arg-type]
    ],
    ids=["binary", "mismatched", "float-targets", "pad", "sum", "shape-1", "number"],
)
def test_any_other_case_is_left_to_update(metric, output):
    if type(metric) is AccuracyMetric and metric.pad_token is None:
        checked(metric)
    reader = quick_reader(type(output), metric)
    assert reader is None or reader(output) is None


def test_an_unchecked_epoch_and_other_outputs_are_left_to_update():
    fresh = AccuracyMetric()  # the epoch's first batch is not checked yet
    reader = quick_reader(ClassificationOutput, fresh)
    assert reader is not None and reader(ClassificationOutput(LOSS, SCORES, CLASSES)) is None
    sequence = SequenceOutput(LOSS, torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long))
    assert quick_reader(type(sequence), AccuracyMetric()) is None
    assert quick_reader(type(sequence), LossMetric()) is None

    class Subclassed(ClassificationOutput):
        pass

    assert quick_reader(Subclassed, LossMetric()) is None
    assert quick_reader(ClassificationOutput, type("Mine", (AccuracyMetric,), {})()) is None


def fit(directory) -> None:
    torch.manual_seed(0)
    model = Classifier()
    (
        blob_builder(directory)
        .metric_train_numeric(AccuracyMetric())
        .num_epochs(2)
        .build(model, torch.optim.Adam(model.parameters(), lr=1e-2), 1e-2)
        .fit(
            DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(3).build(BlobDataset(96)),
            DataLoaderBuilder(BlobBatcher()).batch_size(24).build(BlobDataset(60, seed=1)),
        )
    )


def test_a_fit_read_quickly_writes_what_one_read_by_update_writes(tmp_path, monkeypatch):
    calls = []

    def counting(output_type, metric):
        reader = quick_reader(output_type, metric)
        if reader is None:
            return None

        def read(item):
            calls.append(type(metric).__name__)
            return reader(item)

        return read

    monkeypatch.setattr(processor_module, "quick_reader", counting)
    fit(tmp_path / "quick")
    assert calls.count("AccuracyMetric") > 10 and calls.count("LossMetric") > 10
    monkeypatch.setattr(processor_module, "quick_reader", lambda output_type, metric: None)
    fit(tmp_path / "update")
    logs = sorted(p.relative_to(tmp_path / "quick") for p in (tmp_path / "quick").rglob("*.log"))
    metric_logs = [p for p in logs if p.parts[0] in ("train", "valid")]
    assert len(metric_logs) == 2 * 4
    for path in metric_logs:
        text = (tmp_path / "quick" / path).read_text()
        assert text and text == (tmp_path / "update" / path).read_text(), path
