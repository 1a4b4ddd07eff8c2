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
from ember.train.lr_finder import rates, stability_edge, steepest_fall, suggest
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
    # stops past there, and suggests about half of it
    assert result.diverged
    assert 0.5 < result.lrs[-1] < 100.0
    assert 0.25 <= result.suggestion <= 1.0
    assert result.suggestion == result.edge / 2
    assert result.losses[-1] > 4 * min(result.smoothed)
    assert len(result.ratios) == len(result.lrs)
    measured = [r for lr, r in zip(result.lrs, result.ratios) if 1e-3 < lr < 0.1]
    assert measured and all(0.8 < r < 1.05 for r in measured)  # small steps do as promised
    for name, tensor in subject.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert [dict(g, params=None) for g in subject.optimizer.param_groups] == groups_before
    assert all(p.grad is None for p in subject.model.parameters())

    saved = json.loads((tmp_path / "lr-find.json").read_text())
    assert saved["format"] == "ember-lr-find"
    assert saved["lrs"] == result.lrs and saved["suggestion"] == result.suggestion
    loaded = LrFinderResult.load(result.path)
    assert loaded.smoothed == pytest.approx(result.smoothed)
    assert loaded.edge == result.edge
    assert loaded.ratios == pytest.approx(result.ratios, nan_ok=True)


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


def test_without_an_edge_the_suggestion_is_the_steepest_fall_before_the_lowest_loss():
    """A curve falling fastest at 1e-2 (a tanh in log10(lr)), then rising; no step
    measured (no ratios) and no divergence: the fallback rule."""
    lrs = rates(1e-6, 10.0, 120, "exp")
    losses = [1 - math.tanh(2 * (math.log10(lr) + 2)) for lr in lrs]
    losses = [v if lr < 1.0 else v + (lr - 1.0) for v, lr in zip(losses, lrs)]
    assert steepest_fall(lrs, losses, "exp") == pytest.approx(1e-2, rel=0.15)
    assert suggest(lrs, losses, "exp") == steepest_fall(lrs, losses, "exp")


def test_the_edge_is_where_the_steps_stop_lowering_their_own_loss():
    """The median of three neighbouring ratios decides: one bad step is not the edge."""
    lrs = [0.01 * 2**k for k in range(8)]
    nan = math.nan
    ratios = [nan, 0.95, -0.2, 0.9, 0.6, 0.1, -0.3, -2.0]
    assert stability_edge(lrs, ratios) == lrs[6]
    assert suggest(lrs, [1.0] * 8, "exp", ratios) == lrs[6] / 2
    assert stability_edge(lrs, [0.9] * 8) is None
    # a test that diverged before any ratio fell: half its last rate
    assert suggest(lrs, [1.0] * 8, "exp", [0.9] * 8, diverged=True) == lrs[-1] / 2


def least_squares(seed=0, samples=1024, features=8, top=16.0):
    """Inputs whose mean-squared-error Hessian 2 X^T X / n has the eigenvalues `top` down
    to `top / 50` (so full-batch gradient descent is stable below 2 / top = 0.125),
    targets from a random linear map plus noise; shuffled mini-batches of 32."""
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(features, features, generator=generator))
    eigenvalues = torch.logspace(math.log10(top), math.log10(top / 50), features)
    z = torch.randn(samples, features, generator=generator)
    z = torch.linalg.qr(z - z.mean(0))[0] * math.sqrt(samples)  # z^T z / n = I
    x = z @ torch.diag(torch.sqrt(eigenvalues / 2)) @ basis.T
    y = x @ torch.randn(features, 1, generator=generator)
    y = y + 0.1 * torch.randn(samples, 1, generator=generator)
    hessian = 2 * x.T @ x / samples
    order = torch.randperm(samples, generator=generator)
    batches = [(x[order[i : i + 32]], y[order[i : i + 32]]) for i in range(0, samples, 32)]
    return batches, float(torch.linalg.eigvalsh(hessian).max()), (x, y)


class NoBias(Linear):
    def __init__(self, features=8):
        super().__init__()
        self.net = nn.Linear(features, 1, bias=False)


def gradient_descent(model, batches, lr, steps):
    """`steps` plain SGD steps at `lr` through `batches` (in turn); the first and last
    losses (the last is inf once the loss is not finite or past 1e6)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    first = None
    for step in range(steps):
        loss = model.train_step(batches[step % len(batches)]).item.loss
        first = loss.item() if first is None else first
        if not math.isfinite(loss.item()) or loss.item() > 1e6:
            return first, math.inf
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return first, loss.item()


def find(tmp_path, make_model, batches, seed=0):
    """The range test with SGD and its default rates (1e-7 to 10 in 100 steps) of the
    model `make_model()` makes after seeding with `seed`."""
    torch.manual_seed(seed)
    subject = (
        LearnerBuilder(tmp_path / "find")
        .renderer(PlainRenderer(interval=3600))
        .build(make_model(), SgdConfig().init(), 0.01)
    )
    return subject.lr_find(batches)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_least_squares_the_suggestion_is_within_2x_below_the_largest_stable_rate(
    tmp_path, one_thread, seed
):
    """The Hessian is known: gradient descent is stable below 2 / its largest eigenvalue
    (0.125). The suggestion lies in [0.0625, 0.125], and full-batch gradient descent at
    it converges, where at twice the largest stable rate it diverges. (The rule before,
    the steepest fall of the smoothed loss, suggested 0.25 to 0.36 of the stable rate on
    these three problems.)"""
    batches, top, (x, y) = least_squares(seed)
    stable = 2 / top
    assert stable == pytest.approx(0.125, rel=1e-4)
    result = find(tmp_path, NoBias, batches, seed)
    assert stable / 2 <= result.suggestion <= stable, (result.suggestion, stable)
    whole = [(x, y)]
    torch.manual_seed(1)
    start, end = gradient_descent(NoBias(), whole, result.suggestion, 50)
    assert end < 0.01 * start  # 0.1 (noise) in a few dozen steps
    torch.manual_seed(1)
    assert gradient_descent(NoBias(), whole, 2 * stable, 50)[1] == math.inf


class Mlp(nn.Module):
    """Linear(8, 32), tanh, Linear(32, 1) on a smooth regression."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def train_step(self, batch):
        x, y = batch
        predicted = self.net(x)
        return TrainOutput(RegressionOutput(F.mse_loss(predicted, y), predicted, y))


def wave(seed=1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 8, generator=generator)
    y = torch.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    y = y + 0.1 * torch.randn(2048, 1, generator=generator)
    return [(x[i : i + 64], y[i : i + 64]) for i in range(0, 2048, 64)]


@pytest.mark.parametrize("seed", [0, 1])
def test_on_a_small_mlp_the_suggestion_is_within_2x_below_the_largest_stable_rate(
    tmp_path, one_thread, seed
):
    """The stable range established by training: 200 SGD steps at rates 1.25x apart,
    stable while the loss stays finite and ends below where it began. (The rule before
    suggested 1.2e-7 for the second model.)"""
    batches = wave()
    stable = None
    for k in range(40):
        lr = 0.05 * 1.25**k
        start, end = gradient_descent(Mlp(seed), batches, lr, 200)
        if not end < start:
            break
        stable = lr
    assert stable is not None and 0.2 < stable < 2.0, stable
    result = find(tmp_path, lambda: Mlp(seed), batches, seed)
    assert stable / 2 <= result.suggestion <= stable, (result.suggestion, stable)


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
