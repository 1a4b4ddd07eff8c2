"""Validation inside epochs (`valid_every`): files, history, renderers, early stopping,
the training it must not disturb, and exact resume around it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ember_testing import (
    Classifier,
    assert_same_state,
    blob_builder,
    final_weights,
    stopped_and_resumed,
)
from test_distributed import final
from test_distributed import run as run_processes

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, MetricEarlyStoppingStrategy, ValidPoint
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.state import RunTracker, column_label, shown_value


class Points:
    def __init__(self):
        self.seen: list[ValidPoint] = []

    def on_event(self, event):
        if isinstance(event, ValidPoint):
            self.seen.append(event)


def fit(directory, loaders, every=None, epochs=2, limit=None, renderer=None, listener=None):
    ember.seed(3)
    options = blob_builder(directory, renderer).num_epochs(epochs)
    if every is not None:
        options = options.valid_every(every)
    if limit is not None:
        options = options.limit_batches(train=limit)
    if listener is not None:
        options = options.listener(listener)
    learner = options.build(Classifier(), AdamConfig().init(), 1e-2)
    return learner, learner.fit(*loaders)


def test_points_are_written_beside_the_epoch_validation_and_recorded(tmp_path, loaders, quiet):
    listener = Points()
    learner, _ = fit(tmp_path / "run", loaders, every=3, renderer=quiet, listener=listener)
    run_dir = tmp_path / "run"
    # 7 batches an epoch: points after steps 3 and 6; step 7 ends the epoch
    for epoch in (1, 2):
        assert sorted(p.name for p in (run_dir / "valid" / f"epoch-{epoch}").iterdir()) == [
            "Accuracy.log",
            "Loss.log",
            "iteration-3",
            "iteration-6",
        ]
        for point in (3, 6):
            rows = read_metric_log(
                run_dir / "valid" / f"epoch-{epoch}" / f"iteration-{point}" / "Loss.log"
            )
            assert [weight for _, weight in rows] == [32, 32, 26]  # the whole 90-sample loader
    saved = RunHistory.load(run_dir / "history.jsonl").to_json()
    assert [(p["epoch"], p["iteration"]) for p in saved["points"]] == [
        (1, 3),
        (1, 6),
        (2, 3),
        (2, 6),
    ]
    history = RunHistory.load(run_dir / "history.jsonl")
    assert [(e, i) for e, i, _ in history.points] == [(1, 3), (1, 6), (2, 3), (2, 6)]
    # the point's value is the weighted mean of its lines
    rows = read_metric_log(run_dir / "valid" / "epoch-2" / "iteration-6" / "Loss.log")
    mean = sum(v * w for v, w in rows) / sum(w for _, w in rows)
    assert history.points[3][2]["valid"]["Loss"] == pytest.approx(mean, rel=1e-12)
    assert [(p.epoch, p.iteration) for p in listener.seen] == [(1, 3), (1, 6), (2, 3), (2, 6)]
    assert listener.seen[0].values == history.points[0][2]["valid"]
    # the end-of-epoch values keep their meaning: the epochs of learner.history
    assert [epoch for epoch, _ in learner.history] == [1, 2]
    assert "valid epoch 1/2 at iteration 3: 3 iterations, 90 items" in quiet.stream_text.getvalue()
    first = (run_dir / "experiment.log").read_text().splitlines()[0]
    assert "validation every 3 optimizer steps" in first


def test_a_point_equals_the_end_of_epoch_validation_after_as_many_batches(tmp_path, loaders):
    """Independent reference: a run limited to 3 batches validates at its epoch end on
    the weights a point at iteration 3 sees."""
    fit(tmp_path / "points", loaders, every=3, epochs=1)
    short, _ = fit(tmp_path / "short", loaders, epochs=1, limit=3)
    point = RunHistory.load(tmp_path / "points" / "history.jsonl").points[0]
    assert point[:2] == (1, 3)
    assert point[2]["valid"] == short.history[0][1]["valid"]


def test_points_leave_training_unchanged(tmp_path, loaders, one_thread):
    """Validation restores train mode and every random generator: the dropout model
    trains to the same weights with and without points."""
    _, with_points = fit(tmp_path / "with", loaders, every=2)
    _, without = fit(tmp_path / "without", loaders)
    for (name, a), (_, b) in zip(with_points.state_dict().items(), without.state_dict().items()):
        assert torch.equal(a, b), name
    assert all(training for split, training, _ in with_points.seen if split == "train")
    assert all(
        not training and inference
        for split, training, inference in with_points.seen
        if split == "valid"
    )


class Shared(list):
    """A record the copies of a model share (a deep copy keeps it)."""

    def __deepcopy__(self, memo):
        return self


class Carrying(Classifier):
    """Counts its batches since a split started, as a recurrent model carries its hidden
    state; every step notes its split and count in a record its copies share."""

    def __init__(self):
        super().__init__()
        self.carried = 0
        self.counts = Shared()

    def on_split_start(self, split):
        self.carried = 0

    def count(self, split):
        self.carried += 1
        self.counts.append((split, self.carried))

    def train_step(self, batch):
        self.count("train")
        return super().train_step(batch)

    def valid_step(self, batch):
        self.count("valid")
        return super().valid_step(batch)


def test_a_point_starts_validation_afresh_and_training_carries_on(tmp_path, loaders, quiet):
    """Each point validates from a fresh state, as the epoch's end does, and the
    training batches after it carry on from the state training left."""
    ember.seed(3)
    model = Carrying()
    blob_builder(tmp_path / "run", quiet).valid_every(3).num_epochs(1).build(
        model, AdamConfig().init(), 1e-2
    ).fit(*loaders)
    counts = [(split, count) for split, count in model.counts if split == "train"]
    assert counts == [("train", count) for count in range(1, 8)]  # 7 batches, points at 3, 6
    valid = [count for split, count in model.counts if split == "valid"]
    # 3 validation batches; the check before training, 2 points, then the epoch's end
    assert valid == [1] + [1, 2, 3] * 3


def test_early_stopping_counts_validation_points_and_stops_mid_epoch(tmp_path, loaders):
    ember.seed(3)
    learner = (
        blob_builder(tmp_path / "run")
        .with_file_checkpointer(DefaultRecorder())
        .valid_every(2)
        .early_stopping(MetricEarlyStoppingStrategy(LossMetric(), no_improvement_since=2))
        .num_epochs(3)
        .build(Classifier(), AdamConfig().init(), 0.0)  # no learning: the loss never improves
    )
    learner.fit(*loaders)
    assert learner.outcome.startswith(
        "stopped early: valid Loss has not improved for 2 validations"
    )
    assert "at epoch 1, iteration 2)" in learner.outcome
    assert learner.exit_code == 0
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert "Checkpoint of epoch 1, iteration 6 written" in log
    assert learner.history == []  # no epoch completed
    points = RunHistory.load(tmp_path / "run" / "history.jsonl").points
    assert [(e, i) for e, i, _ in points] == [(1, 2), (1, 4), (1, 6)]


def test_an_early_stopping_on_epochs_counts_the_epoch_end_as_a_point(tmp_path, loaders):
    strategy = MetricEarlyStoppingStrategy(LossMetric(), no_improvement_since=1)
    points = [
        (1, 3, {"valid": {"Loss": 0.5}}),
        (1, None, {"valid": {"Loss": 0.4}}),
        (2, 3, {"valid": {"Loss": 0.45}}),
    ]
    assert strategy.should_stop_at_point(points) == (
        "valid Loss has not improved for 1 validations (best 0.4 at epoch 1 end)"
    )
    assert strategy.should_stop_at_point(points[:2]) is None


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_valid_every_refuses_what_is_not_a_positive_int(tmp_path, bad):
    with pytest.raises(ConfigError, match="valid_every takes a number of optimizer steps"):
        LearnerBuilder(tmp_path).valid_every(bad)


def test_valid_every_without_validation_data_is_refused(tmp_path, loaders):
    learner = blob_builder(tmp_path).valid_every(2).build(Classifier(), AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError, match=r"pass it as fit\(train, valid\)"):
        learner.fit(loaders[0])


def test_the_dashboard_shows_a_point_as_the_latest_validation():
    """After a point the validation column and the legend hold its values and say where
    it ran; the epoch's own validation takes over when it ends; each is marked on the
    chart where it ran (epoch 1 spans x in (0, 1])."""
    tracker = RunTracker()
    tracker.start(RunInfo("run", 1, 2, "Net", 1, ("cpu",), (("valid", "Loss", "", True),)))
    views = [
        MetricView("train", "Loss", "", True, 0.9, 0.8),
        MetricView("valid", "Loss", "", True, 0.7, 0.6),
    ]
    tracker.update(Progress("train", 1, 2, 3, 8, 96, 1.0), views, [])
    point = [MetricView("valid", "Loss", "", True, 0.55, 0.5)]
    tracker.valid_point(4, Progress("valid", 1, 2, 3, 3, 90, 0.1), point)
    tracker.update(Progress("train", 1, 2, 5, 8, 160, 1.2), views, [])
    snapshot = tracker.snapshot("Loss")
    valid = next(view for view in snapshot.views if view.split == "valid")
    assert shown_value(snapshot, valid, "epoch") == 0.5
    assert column_label(snapshot, "valid", "epoch") == "valid (epoch 1, iteration 4)"
    assert snapshot.validations == ((0.5, 0.5, "epoch 1, iteration 4"),)
    tracker.end_split(Progress("valid", 1, 2, 3, 3, 90, 0.1), views)  # the epoch's validation
    tracker.update(Progress("train", 2, 2, 1, 8, 32, 0.1), views, [])
    snapshot = tracker.snapshot("Loss")
    assert shown_value(snapshot, valid, "epoch") == 0.6
    assert column_label(snapshot, "valid", "epoch") == "valid (epoch 1)"
    assert [(x, v) for x, v, _ in snapshot.validations] == [(0.5, 0.5), (1.0, 0.6)]


@pytest.mark.slow
def test_sigterm_mid_epoch_with_points_then_resume_equals_an_uninterrupted_run(tmp_path):
    straight, resumed = stopped_and_resumed(tmp_path, "--valid-every", "4")
    assert_same_state(final_weights(straight), final_weights(resumed))
    histories = [RunHistory.load(tmp_path / d / "history.jsonl") for d in ("straight", "resumed")]
    assert histories[0].points == histories[1].points
    assert [(e, i) for e, i, _ in histories[1].points] == [
        (epoch, i) for epoch in (1, 2, 3) for i in (4, 8, 12, 16)
    ]
    for epoch in (1, 2, 3):
        for point in (4, 8, 12, 16):
            path = Path("valid") / f"epoch-{epoch}" / f"iteration-{point}" / "Loss.log"
            assert read_metric_log(straight / path) == read_metric_log(resumed / path), path


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_validate_at_the_same_points_as_one(tmp_path, strategy):
    """Each process validates its share; the point values cover the whole loader. With
    a batch limit, every process takes the same number of steps (as FSDP needs)."""
    options = ("--valid-every", "2", "--limit-train", "5", "--epochs", "2", "--mlp")
    one = run_processes(tmp_path / "one", "--processes", "1", "--batch", "32", *options)
    two = run_processes(
        tmp_path / "two", "--processes", "2", "--batch", "16", "--strategy", strategy, *options
    )
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = (RunHistory.load(tmp_path / d / "history.jsonl").points for d in ("one", "two"))
    assert (
        [(e, i) for e, i, _ in a] == [(e, i) for e, i, _ in b] == [(1, 2), (1, 4), (2, 2), (2, 4)]
    )
    for (_, _, x), (_, _, y) in zip(a, b):
        for name, value in x["valid"].items():
            assert y["valid"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    rows = read_metric_log(tmp_path / "two" / "valid" / "epoch-2" / "iteration-4" / "Loss.log")
    assert sum(weight for _, weight in rows) == 61  # every validation sample, both ranks
    assert len(read_metric_log(tmp_path / "two" / "train" / "epoch-1" / "Loss.log")) == 10
    for name, value in final(tmp_path / "one").items():
        torch.testing.assert_close(final(tmp_path / "two")[name], value, rtol=1e-5, atol=1e-6)


def test_a_matrix_metric_saves_its_counts_at_each_point(tmp_path, loaders):
    from ember.train.files.metric_files import read_matrix
    from ember.train.metric import ConfusionMatrixMetric

    ember.seed(3)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid(ConfusionMatrixMetric())
        .renderer(PlainRenderer(interval=3600))
        .valid_every(3)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    _, counts = read_matrix(
        tmp_path / "valid" / "epoch-1" / "iteration-3" / "Confusion_Matrix.json"
    )
    assert sum(map(sum, counts)) == 90  # every validation sample, once
    assert (tmp_path / "valid" / "epoch-1" / "Confusion_Matrix.json").exists()  # the epoch's
