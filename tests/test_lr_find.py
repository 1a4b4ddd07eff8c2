"""The learning-rate range test (`learner.lr_find`) and its chart (`ember plot`)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.cli import main as ember_cli
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError
from ember.optim import AdamConfig, SgdConfig
from ember.train import LearnerBuilder, LrFinderResult, RegressionOutput, TrainOutput, lr_find
from ember.train.lr_finder import rates, suggest
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer


class Linear(nn.Module):
    """y = x @ w: least squares, whose largest stable SGD rate is known."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def regress(self, batch):
        x, y = batch
        predicted = self.net(x)
        return RegressionOutput(F.mse_loss(predicted, y), predicted, y)

    def train_step(self, batch):
        return TrainOutput(self.regress(batch))

    def valid_step(self, batch):
        return self.regress(batch)


def regression():
    ember.seed(0)
    x = torch.randn(512, 4)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]]) + 1.0
    return DataLoaderBuilder().batch_size(32).shuffle(1).build(list(zip(x, y)))


def learner(directory, optimizer=None, lr=0.1):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600))
        .build(Linear(), optimizer or SgdConfig().init(), lr)
    )


def test_the_suggestion_is_a_sensible_rate_and_the_model_is_unchanged(tmp_path, one_thread):
    train = regression()
    ember.seed(1)
    subject = learner(tmp_path)
    before = {k: v.clone() for k, v in subject.model.state_dict().items()}
    groups_before = [dict(g, params=None) for g in subject.optimizer.param_groups]
    result = subject.lr_find(train, start=1e-5, end=100.0, steps=100)

    # SGD on this least-squares problem (inputs of unit variance, a bias) diverges for
    # rates above 2 / (2 * largest eigenvalue of E[xx^T] incl. the bias) ~ 1: the test
    # stops there, and the steepest fall lies well below
    assert result.diverged
    assert 0.5 < result.lrs[-1] < 100.0
    assert 1e-3 <= result.suggestion <= 0.5
    assert result.losses[-1] > 4 * min(result.smoothed)
    for name, tensor in subject.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert [dict(g, params=None) for g in subject.optimizer.param_groups] == groups_before
    assert all(p.grad is None for p in subject.model.parameters())

    saved = json.loads((tmp_path / "lr-find.json").read_text())
    assert saved["format"] == "ember-lr-find"
    assert saved["lrs"] == result.lrs and saved["suggestion"] == result.suggestion
    assert LrFinderResult.load(result.path).smoothed == pytest.approx(result.smoothed)


def test_a_fit_after_lr_find_is_the_fit_without_it(tmp_path, one_thread):
    """Weights, Adam's state, the rates and every random generator are put back."""

    def fit(directory, probe):
        train = regression()
        ember.seed(2)
        subject = learner(directory, AdamConfig().init(), 1e-2)
        if probe:
            subject.lr_find(train, steps=30)
        return subject.fit(train)

    a, b = fit(tmp_path / "probed", True), fit(tmp_path / "plain", False)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_the_rates_rise_from_start_to_end():
    exp = rates(1e-6, 1.0, 7, "exp")
    assert exp[0] == 1e-6 and exp[-1] == pytest.approx(1.0)
    assert all(b / a == pytest.approx(10.0) for a, b in itertools.pairwise(exp))
    linear = rates(0.1, 1.0, 10, "linear")
    assert all(b - a == pytest.approx(0.1) for a, b in itertools.pairwise(linear))


def test_the_suggestion_is_the_steepest_fall_before_the_lowest_loss():
    """A curve falling fastest at 1e-2 (a tanh in log10(lr)), then rising."""
    lrs = rates(1e-6, 10.0, 120, "exp")
    losses = [1 - math.tanh(2 * (math.log10(lr) + 2)) for lr in lrs]
    losses = [v if lr < 1.0 else v + (lr - 1.0) for v, lr in zip(losses, lrs)]
    assert suggest(lrs, losses, "exp") == pytest.approx(1e-2, rel=0.15)


def test_the_curve_is_drawn_by_ember_plot(tmp_path, capsys):
    subject = learner(tmp_path)
    lr_find(subject, regression(), steps=40)  # the function form
    assert ember_cli(["plot", str(tmp_path)]) == 0  # no metric logs yet: the curve alone
    chart = tmp_path / "plots" / "lr-find.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(chart) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"start": 0.0}, "start=...\\) must be a learning rate > 0"),
        ({"start": 1.0, "end": 0.5}, "needs end > start"),
        ({"steps": 1}, "steps=...\\) must be an int >= 2"),
        ({"mode": "log"}, "takes 'exp' or 'linear'"),
        ({"diverge": 1.0}, "must be a factor > 1"),
        ({"smoothing": 1.0}, "must be in \\[0, 1\\)"),
    ],
)
def test_options_that_cannot_work_are_refused(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        learner(tmp_path).lr_find(regression(), **options)
    assert not (tmp_path / "lr-find.json").exists()
