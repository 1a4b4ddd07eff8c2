"""One run, one story: a replaced run leaves nothing behind, a resumed run says where
it resumes, and only plotted (numeric) metrics get charts."""

from __future__ import annotations

import pytest
import torch
from ember_testing import Classifier, StopAt

from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.logger.base import MetricRecord
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer.base import Progress, RunInfo
from ember.train.renderer.state import RunTracker


class Broken(Classifier):
    def train_step(self, batch):
        raise RuntimeError("a bug in the step")


def test_overwrite_after_a_failed_run_starts_a_fresh_log(tmp_path, loaders, quiet):
    failing = LearnerBuilder(tmp_path).metric_train(LossMetric()).renderer(quiet)
    with pytest.raises(RuntimeError):
        failing.build(Broken(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert "a bug in the step" in (tmp_path / "experiment.log").read_text()
    fresh = LearnerBuilder(tmp_path, overwrite=True).metric_train(LossMetric()).renderer(quiet)
    fresh.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    log = (tmp_path / "experiment.log").read_text()
    assert "a bug in the step" not in log and "Training completed" in log


@pytest.mark.parametrize("epoch", [1, 2])
def test_a_resumed_run_says_where_it_resumes(tmp_path, loaders, quiet, epoch):
    def builder():
        return (
            LearnerBuilder(tmp_path)
            .metric_train_numeric(AccuracyMetric())
            .with_file_checkpointer(DefaultRecorder())
            .num_epochs(3)
            .renderer(quiet)
        )

    first = builder()
    first.listener(StopAt(first.interrupter(), epoch, 3))
    first.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    quiet.stream_text.truncate(0)
    quiet.stream_text.seek(0)
    builder().checkpoint("latest").build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    first_line = quiet.stream_text.getvalue().splitlines()[0]
    assert first_line.startswith(f"resuming at epoch {epoch}/3, iteration 3: Classifier")


def test_text_metrics_get_no_chart():
    tracker = RunTracker()
    info = RunInfo(
        "dir",
        1,
        2,
        "Model",
        10,
        ("cpu",),
        metrics=(("train", "Loss", "", True), ("train", "Note", "", False)),
    )
    tracker.start(info)
    progress = Progress("train", 1, 2, 2, 4, 64, 1.0)
    records = [MetricRecord("Loss", 1, 0.5, 32), MetricRecord("Note", 1, 1.0, 32)]
    tracker.update(progress, [], records)
    tracker.update(progress, [], [MetricRecord("Custom", 2, 3.0, 32)])  # not registered
    assert tracker.names == ["Loss", "Custom"]  # "Note" is text: shown, never plotted


def test_a_second_fit_does_not_touch_the_first_runs_files(tmp_path, loaders, quiet):
    learner = (
        LearnerBuilder(tmp_path, overwrite=True)
        .metric_train(LossMetric())
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    before = (tmp_path / "experiment.log").read_text()
    with pytest.raises(TrainingError, match="already called"):
        learner.fit(*loaders)
    assert (tmp_path / "experiment.log").read_text() == before


class Stateful(Classifier):
    """Keeps a count across batches, reset at each split's start, as a recurrent model
    carrying its hidden state would."""

    def __init__(self):
        super().__init__()
        self.carried = 0
        self.valid_calls = 0
        self.starts: list[str] = []

    def on_split_start(self, split):
        self.starts.append(split)
        self.carried = 0

    def train_step(self, batch):
        self.carried += 1
        return super().train_step(batch)

    def valid_step(self, batch):
        self.carried += 1
        self.valid_calls += 1
        return super().valid_step(batch)


def test_a_stateful_model_is_told_each_split_and_untouched_by_the_check(tmp_path, loaders, quiet):
    from ember.train import StartEpoch, StartSplit

    events = []

    class Record:
        def on_event(self, event):
            if isinstance(event, (StartEpoch, StartSplit)):
                events.append(event)

    model = Stateful()
    LearnerBuilder(tmp_path).metric_valid_numeric(AccuracyMetric()).num_epochs(2).listener(
        Record()
    ).renderer(quiet).build(model, AdamConfig().init(), 1e-2).fit(*loaders)
    valid_batches = len(loaders[1])
    assert model.valid_calls == 2 * valid_batches  # the check before training used a copy
    assert model.starts == ["train", "valid", "train", "valid"]
    assert model.carried == valid_batches  # reset at the last split's start
    assert [type(e).__name__ for e in events] == [
        "StartEpoch",
        "StartSplit",
        "StartSplit",
        "StartEpoch",
        "StartSplit",
        "StartSplit",
    ]
    assert [e.split for e in events if isinstance(e, StartSplit)] == ["train", "valid"] * 2


class CarriesInExtraState(Stateful):
    """Keeps its carried count in its extra state, which checkpoints save with it."""

    def __init__(self):
        super().__init__()
        self.seen_at_resume: list[int] = []

    def get_extra_state(self):
        return {"carried": self.carried}

    def set_extra_state(self, state):
        self.carried = int(state["carried"])
        self.seen_at_resume.append(self.carried)


def test_a_split_resumed_in_its_middle_keeps_the_models_restored_state(tmp_path, loaders, quiet):
    def builder():
        return (
            LearnerBuilder(tmp_path)
            .metric_train_numeric(AccuracyMetric())
            .with_file_checkpointer(DefaultRecorder())
            .num_epochs(1)
            .renderer(quiet)
        )

    first = builder()
    first.listener(StopAt(first.interrupter(), 1, 3))
    first.build(CarriesInExtraState(), AdamConfig().init(), 1e-2).fit(loaders[0])
    model = CarriesInExtraState()
    builder().checkpoint("latest").build(model, AdamConfig().init(), 1e-2).fit(loaders[0])
    assert model.seen_at_resume == [3]  # restored from the checkpoint
    assert model.starts == []  # not reset: the train split went on from batch 4
    assert model.carried == len(loaders[0])  # counted on from 3 to the last batch


class CountsInABuffer(Classifier):
    """Counts its validation batches in a buffer (in place, as running statistics are
    kept), and notes in `weights_seen` (not an attribute: a copy of the model shares it) the
    storage of its first weight at each validation batch."""

    def __init__(self):
        super().__init__()
        self.register_buffer("valid_batches", torch.zeros((), dtype=torch.int64))

    def valid_step(self, batch):
        self.valid_batches += 1
        weights_seen.append(self.net[0].weight.data_ptr())
        return super().valid_step(batch)


weights_seen: list[int] = []


def test_the_check_before_training_shares_the_weights_and_copies_the_rest(tmp_path, loaders, quiet):
    # A second copy of the weights would raise the run's peak memory by the model's size.
    weights_seen.clear()
    model = CountsInABuffer()
    learner = LearnerBuilder(tmp_path).metric_valid_numeric(AccuracyMetric()).renderer(quiet)
    learner.num_epochs(1).build(model, AdamConfig().init(), 1e-2).fit(*loaders)
    valid_batches = len(loaders[1])
    assert int(model.valid_batches) == valid_batches  # the check counted on its copy's buffer
    live = model.net[0].weight.data_ptr()
    assert weights_seen == [live] * (1 + valid_batches)  # the check's batch, then the validation's
