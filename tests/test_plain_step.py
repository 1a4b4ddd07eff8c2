"""A step of one batch with nothing around its forward and backward takes the loop's
short path (`Stepper.plain_step`); a run that takes it trains exactly as one whose
listener keeps every step on the general path (`Stepper.step`): the same weights,
the same metric files, the same epoch values."""

from __future__ import annotations

import io

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

from ember.data import DataLoaderBuilder
from ember.train import LearnerBuilder
from ember.train.fit.stepper import Stepper
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Silent:
    """A listener that does nothing (its presence keeps steps off the short path)."""

    def on_event(self, event) -> None:
        pass


def fit(directory, listener: bool):
    torch.manual_seed(0)
    model = Classifier()
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(3)
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .renderer(PlainRenderer(interval=0.0, stream=io.StringIO()))
        .num_epochs(2)
    )
    if listener:
        builder = builder.listener(Silent())
    learner = builder.build(model, torch.optim.Adam(model.parameters(), lr=1e-2), 1e-2)
    trained = learner.fit(
        loader.build(BlobDataset(96)),
        DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1)),
    )
    return trained, learner.history


@pytest.fixture
def counted(monkeypatch):
    calls = {"plain": 0, "general": 0}
    plain, general = Stepper.plain_step, Stepper.step

    def run_plain_step(*args, **kwargs):
        calls["plain"] += 1
        return plain(*args, **kwargs)

    def run_step(*args, **kwargs):
        calls["general"] += 1
        return general(*args, **kwargs)

    monkeypatch.setattr(Stepper, "plain_step", run_plain_step)
    monkeypatch.setattr(Stepper, "step", run_step)
    return calls


def test_the_short_path_trains_exactly_as_the_general_one(tmp_path, counted):
    short, short_history = fit(tmp_path / "short", listener=False)
    assert counted == {"plain": 11, "general": 1}  # 2 epochs of 6 steps; the first is checked
    counted.update(plain=0, general=0)
    general, general_history = fit(tmp_path / "general", listener=True)
    assert counted == {"plain": 0, "general": 12}

    for name, tensor in short.state_dict().items():
        assert torch.equal(tensor, general.state_dict()[name]), name
    assert short_history == general_history
    files = sorted(p.relative_to(tmp_path / "short") for p in (tmp_path / "short").rglob("*.log"))
    metric_files = [p for p in files if p.parts[0] in ("train", "valid")]
    assert len(metric_files) == 2 * 3  # two epochs of Accuracy and Loss, and valid Loss
    for path in metric_files:
        assert (tmp_path / "short" / path).read_bytes() == (
            tmp_path / "general" / path
        ).read_bytes()
