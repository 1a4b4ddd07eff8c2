"""A decision at an epoch's end sees the epoch's values and lands in its checkpoint:
a custom anneal-on-plateau rule written as a callback resumes exactly; the same rule
as a listener (acting after the checkpoint) is reported; `ctx.values` holds the
numbers of history.jsonl."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.record import DefaultRecorder
from ember.train import EndEpoch, LearnerBuilder
from ember.train.callbacks import Callback
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer


class Annealed:
    """A learning rate that a rule of the script's divides (an ember schedule)."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def step(self) -> float:
        return self.lr

    def state_dict(self) -> dict:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict) -> None:
        self.lr = float(state["lr"])


class AnnealOnPlateau(Callback):
    """word_language_model's rule: divide the rate by 4 when the validation loss did
    not improve (here: halved, so that it fires on this small task)."""

    def __init__(self, schedule: Annealed) -> None:
        self.schedule, self.best = schedule, None
        self.rates: list[float] = []

    def on_epoch_end(self, ctx) -> None:
        loss = ctx.values["valid"]["Loss"]
        if self.best is not None and loss > 0.5 * self.best:
            self.schedule.lr /= 4
        else:
            self.best = loss
        self.rates.append(self.schedule.lr)

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.best = state["best"]


class AnnealAfter:
    """The same rule as a listener: it sees EndEpoch, after the checkpoint."""

    def __init__(self, schedule: Annealed) -> None:
        self.schedule, self.best = schedule, None

    def on_event(self, event) -> None:
        if isinstance(event, EndEpoch):
            loss = event.aggregates["valid"]["Loss"]
            if self.best is not None and loss > 0.5 * self.best:
                self.schedule.lr /= 4
            else:
                self.best = loss

    def state_dict(self) -> dict:
        return {"best": self.best}


def loaders():
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(4).build(BlobDataset(160))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1))
    return train, valid


def run(directory: Path, epochs: int, *, resume: bool = False, listener: bool = False):
    """A run of the anneal rule; returns the learner, its model, the rule and the
    renderer's text."""
    torch.set_num_threads(1)
    ember.seed(3)
    schedule = Annealed(0.5)
    stream = io.StringIO()
    builder = (
        LearnerBuilder(directory)
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(PlainRenderer(interval=3600, stream=stream))
    )
    rule = AnnealAfter(schedule) if listener else AnnealOnPlateau(schedule)
    builder = builder.listener(rule) if listener else builder.callback(rule)
    if resume:
        builder = builder.checkpoint("latest")
    learner = builder.build(Classifier(), SgdConfig().init(), schedule)
    model = learner.fit(*loaders())
    return learner, model, rule, stream.getvalue()


def test_an_anneal_rule_in_on_epoch_end_resumes_exactly(tmp_path):
    learner, straight, rule, _ = run(tmp_path / "straight", 5)
    assert learner.outcome == "completed"
    assert len(set(rule.rates)) > 2, rule.rates  # the rule fired, more than once
    run(tmp_path / "resumed", 3)
    learner, resumed, rule, _ = run(tmp_path / "resumed", 5, resume=True)
    assert learner.outcome == "completed"
    for name, tensor in straight.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    straight_history = (tmp_path / "straight" / "history.jsonl").read_text()
    assert [e for e in learner.history] == [e for e in run_history(tmp_path / "straight")], (
        straight_history
    )


def run_history(directory: Path):
    from ember.train.history import RunHistory

    return RunHistory.load(directory / "history.jsonl").entries()


def test_the_same_rule_as_a_listener_is_reported_once_on_the_console_and_in_the_log(
    tmp_path,
):
    learner, _, _, shown = run(tmp_path / "listener", 4, listener=True)
    assert learner.outcome == "completed"
    message = "The listener AnnealAfter changed its state (state_dict) when the listeners"
    assert shown.count(message) == 1, shown
    assert "on_epoch_end" in shown and "ctx.values" in shown
    log = (tmp_path / "listener" / "experiment.log").read_text()
    assert log.count(message) == 1


class Recorded(Callback):
    """Keeps what ctx.values says at each hook that has values."""

    def __init__(self) -> None:
        self.epochs: list[tuple[int, dict]] = []
        self.validations: list[tuple[int, int, dict]] = []

    def on_epoch_end(self, ctx) -> None:
        self.epochs.append((ctx.epoch, ctx.values))

    def on_validation_end(self, ctx) -> None:
        self.validations.append((ctx.epoch, ctx.iteration, ctx.values))


@pytest.mark.parametrize("every", [None, 4])
def test_ctx_values_are_the_numbers_of_the_history(tmp_path, every):
    from ember.train.history import RunHistory
    from ember.train.metric import AccuracyMetric

    ember.seed(1)
    recorded = Recorded()
    builder = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .callback(recorded)
        .num_epochs(2)
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
    )
    if every is not None:
        builder = builder.valid_every(every)
    learner = builder.build(Classifier(), SgdConfig().init(), 0.1)
    learner.fit(*loaders())
    history = RunHistory.load(tmp_path / "history.jsonl")
    assert recorded.epochs == history.entries()
    assert [v for _, v in recorded.epochs] and all("valid" in v for _, v in recorded.epochs)
    ends = [(epoch, {"valid": values["valid"]}) for epoch, values in history.entries()]
    points = [(e, i, {"valid": v["valid"]}) for e, i, v in history.point_entries()]
    inside = [(e, i, v) for e, i, v in recorded.validations if i < 10]  # 10 steps an epoch
    at_ends = [(e, v) for e, i, v in recorded.validations if i == 10]
    assert inside == points
    assert at_ends == ends
    assert len(points) == (4 if every else 0)
