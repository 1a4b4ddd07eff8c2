"""A confusion matrix through a real run: saved with each epoch, equal to scikit-learn's
on the trained model's predictions, printed by `ember summary`, drawn by `ember plot`
and shown by the dashboard's metric view."""

from __future__ import annotations

import json

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier
from sklearn.metrics import confusion_matrix

import ember
from ember.cli import main
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import ConfusionMatrixMetric, LossMetric
from ember.train.renderer.panels import dashboard
from ember.train.renderer.state import RunTracker


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("matrix") / "run"
    ember.seed(0)
    tracker = RunTracker()  # records what a renderer is given, as the dashboard does
    valid = BlobDataset(45, seed=4)  # batches of 16, 16 and 13
    learner = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(ConfusionMatrixMetric.multiclass())
        .metric_valid_numeric(ConfusionMatrixMetric.multiclass())
        .num_epochs(2)
        .renderer(tracker)
        .build(Classifier(dropout=0.0), AdamConfig().init(), 1e-2)
    )
    model = learner.fit(
        DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(64)),
        DataLoaderBuilder(BlobBatcher()).batch_size(16).build(valid),
    )
    with torch.inference_mode():
        predicted = model.eval()(valid.inputs).argmax(-1)
    expected = confusion_matrix(valid.targets.numpy(), predicted.numpy(), labels=[0, 1, 2])
    return directory, tracker, learner, expected.tolist()


def test_each_epoch_saves_its_matrix(run):
    directory, _, learner, expected = run
    saved = json.loads((directory / "valid" / "epoch-2" / "Confusion_Matrix.json").read_text())
    assert saved["counts"] == expected  # the last epoch validated the final weights
    assert saved["name"] == "Confusion Matrix"
    accuracy = 100 * sum(expected[k][k] for k in range(3)) / 45
    assert learner.history[-1][1]["valid"]["Confusion Matrix"] == pytest.approx(accuracy)
    first = json.loads((directory / "train" / "epoch-1" / "Confusion_Matrix.json").read_text())
    assert sum(map(sum, first["counts"])) == 64  # every training sample of the epoch


def test_summary_prints_the_last_matrix(run, capsys):
    directory, _, _, expected = run
    assert main(["summary", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "Confusion Matrix (valid, epoch 2)" in out
    assert "Confusion Matrix (train, epoch 2)" in out
    table = out.split("Confusion Matrix (valid, epoch 2)")[1].splitlines()[3:6]
    cells = [[int(c) for c in row.strip("| ").split(" | ")[1:]] for row in table]
    assert cells == expected


def test_plot_draws_a_heat_map(run, capsys):
    import matplotlib.image as image

    directory, _, _, _ = run
    assert main(["plot", str(directory)]) == 0
    path = directory / "plots" / "Confusion_Matrix-valid-matrix.png"
    assert str(path) in capsys.readouterr().out.split()
    pixels = image.imread(path)
    assert pixels.shape[0] >= 300 and pixels.shape[1] >= 300


def test_the_dashboard_shows_the_matrix_of_the_selected_metric(run):
    _, tracker, _, expected = run
    snapshot = tracker.snapshot("Confusion Matrix")
    assert snapshot.matrices["valid"] == (2, tuple(tuple(row) for row in expected))
    frame = ["".join(text for text, _ in line) for line in dashboard(snapshot, 120, 40)]
    assert any("valid, epoch 2: target ↓ predicted →" in line for line in frame)
    row = "  ".join(f"{count:>2}" for count in expected[2])  # class 2's row, cells apart
    assert any(row.replace("  ", " ") in line for line in frame)
    loss = tracker.snapshot("Loss")  # other metrics keep their chart
    assert not loss.matrices


def test_an_evaluation_saves_its_matrix(tmp_path, quiet):
    from ember.train import EvaluatorBuilder

    ember.seed(0)
    model = Classifier()
    data = BlobDataset(90, seed=1)
    evaluator = (
        EvaluatorBuilder(tmp_path)
        .metric_numeric(ConfusionMatrixMetric.multiclass())
        .devices(["cpu"])
        .renderer(quiet)
        .build(model)
    )
    evaluator.eval("holdout", DataLoaderBuilder(BlobBatcher()).batch_size(32).build(data))
    with torch.inference_mode():
        predicted = model.eval()(data.inputs).argmax(-1)
    expected = confusion_matrix(data.targets.numpy(), predicted.numpy(), labels=[0, 1, 2])
    saved = json.loads((tmp_path / "test" / "holdout" / "Confusion_Matrix.json").read_text())
    assert saved["counts"] == expected.tolist()
