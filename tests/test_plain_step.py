"""A step of one batch with nothing around its forward and backward takes the loop's
short path (`Stepper.plain_step`), and, when nothing but a stop request is decided
after it, the rest of the epoch runs in one loop (`fit/steady.py`). A run on either
trains exactly as one whose listener keeps every step on the general path
(`Stepper.step`): the same weights, the same metric files, the same epoch values."""

from __future__ import annotations

import io

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

from ember.data import DataLoaderBuilder
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.fit import loop
from ember.train.fit.stepper import Stepper
from ember.train.history import RunHistory
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Silent:
    """A listener that does nothing (its presence keeps steps off the short path)."""

    def on_event(self, event) -> None:
        pass


def builder(directory) -> LearnerBuilder:
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .renderer(PlainRenderer(interval=0.0, stream=io.StringIO()))
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(2)
    )


def loaders():
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(3).build(BlobDataset(96))
    return train, DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1))


def fit(directory, listener: bool = False, every: int | None = None):
    torch.manual_seed(0)
    model = Classifier()
    run = builder(directory)
    if listener:
        run = run.listener(Silent())
    if every is not None:  # a decision after each step: off the steady loop
        run = run.checkpoint_every(steps=every)
    learner = run.build(model, torch.optim.Adam(model.parameters(), lr=1e-2), 1e-2)
    trained = learner.fit(*loaders())
    return trained, learner.history


@pytest.fixture
def counted(monkeypatch):
    calls = {"plain": 0, "general": 0, "steady": 0}
    plain, general, steady = Stepper.plain_step, Stepper.step, loop.steady_steps

    def run_plain_step(*args, **kwargs):
        calls["plain"] += 1
        return plain(*args, **kwargs)

    def run_step(*args, **kwargs):
        calls["general"] += 1
        return general(*args, **kwargs)

    def run_steady(parts, state, batches, apply, count):
        def counted_batches():
            for batch in batches:
                calls["steady"] += 1
                yield batch

        return steady(parts, state, counted_batches(), apply, count)

    monkeypatch.setattr(Stepper, "plain_step", run_plain_step)
    monkeypatch.setattr(Stepper, "step", run_step)
    monkeypatch.setattr(loop, "steady_steps", run_steady)
    return calls


def same_run(one, other) -> None:
    """The same weights, history, run counters and metric files."""
    (model, history, directory), (model2, history2, directory2) = one, other
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, model2.state_dict()[name]), name
    assert history == history2
    counters = RunHistory.load(directory / "history.jsonl").counters
    assert counters == RunHistory.load(directory2 / "history.jsonl").counters
    assert [(c["steps"], c["samples"]) for c in counters.values()] == [(6, 96), (12, 192)]
    files = sorted(p.relative_to(directory) for p in directory.rglob("*.log"))
    metric_files = [p for p in files if p.parts[0] in ("train", "valid")]
    assert len(metric_files) == 2 * 3  # two epochs of Accuracy and Loss, and valid Loss
    for path in metric_files:
        assert (directory / path).read_bytes() == (directory2 / path).read_bytes()


@pytest.mark.parametrize(
    ("options", "paths"),
    [
        ({}, {"plain": 0, "general": 1, "steady": 11}),  # 2 epochs of 6 steps; the first checked
        ({"every": 4}, {"plain": 11, "general": 1, "steady": 0}),
    ],
    ids=["steady", "plain"],
)
def test_the_short_paths_train_exactly_as_the_general_one(tmp_path, counted, options, paths):
    short = (*fit(tmp_path / "short", **options), tmp_path / "short")
    assert counted == paths
    counted.update(plain=0, general=0, steady=0)
    general = (*fit(tmp_path / "general", listener=True, **options), tmp_path / "general")
    assert counted == {"plain": 0, "general": 12, "steady": 0}
    same_run(short, general)


class StopsItself(Classifier):
    """A model whose own step asks its run to stop after a given iteration of epoch 1
    (no listener or callback: the steps stay on the steady loop)."""

    def __init__(self, interrupter, iteration: int) -> None:
        super().__init__()
        self.interrupter, self.at, self.steps = interrupter, iteration, 0

    def train_step(self, batch):
        self.steps += 1
        if self.steps == self.at:
            self.interrupter.stop("asked by the model")
        return super().train_step(batch)


def test_a_stop_inside_the_steady_loop_resumes_exactly(tmp_path, counted):
    whole = (*fit(tmp_path / "whole"), tmp_path / "whole")

    counted.update(plain=0, general=0, steady=0)
    torch.manual_seed(0)
    directory = tmp_path / "stopped"
    run = builder(directory)
    model = StopsItself(run.interrupter(), iteration=4)
    learner = run.build(model, torch.optim.Adam(model.parameters(), lr=1e-2), 1e-2)
    learner.fit(*loaders())
    assert counted == {"plain": 0, "general": 1, "steady": 3}  # it stops after the 4th step
    assert learner.outcome == "stopped: asked by the model"
    lines = (directory / "train" / "epoch-1" / "Loss.log").read_text().splitlines()
    assert len(lines) == 4
    assert not (directory / "valid" / "epoch-1").exists()

    torch.manual_seed(0)
    fresh = Classifier()
    again = builder(directory).checkpoint("latest")
    resumed_learner = again.build(fresh, torch.optim.Adam(fresh.parameters(), lr=1e-2), 1e-2)
    resumed = resumed_learner.fit(*loaders())
    same_run(whole, (resumed, resumed_learner.history, directory))


class FailsAt(Classifier):
    """A model whose step raises at its `at`-th call."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.steps = at, 0

    def train_step(self, batch):
        self.steps += 1
        if self.steps == self.at:
            raise ValueError("a broken batch")
        return super().train_step(batch)


def test_an_error_inside_the_steady_loop_names_its_step(tmp_path, counted):
    model = FailsAt(at=10)  # epoch 2, iteration 4
    learner = builder(tmp_path).build(model, torch.optim.Adam(model.parameters(), lr=1e-2), 1e-2)
    with pytest.raises(ValueError, match="a broken batch") as raised:
        learner.fit(*loaders())
    assert counted["steady"] == 5 + 4  # epoch 1's last five, and epoch 2's first four
    assert "ember: raised by train_step at epoch 2, iteration 4" in "".join(raised.value.__notes__)
