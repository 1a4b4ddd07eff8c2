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
from ember.train.lr_finder import SAFETY, rates, smooth, stability_edge, steepest_fall, suggest
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

    # SGD on this least-squares problem is stable below 2 / the largest eigenvalue of
    # its Hessian 2 E[x x^T] (x with a 1 for the bias): about 1
    x = torch.cat([torch.stack([item[0] for item in train.dataset]), torch.ones(512, 1)], 1)
    stable = 2 / float(torch.linalg.eigvalsh(2 * x.T @ x / len(x)).max())
    assert 0.8 < stable < 1.2
    assert stable / 2 <= result.suggestion <= stable, (result.suggestion, stable)
    assert result.rule == "curvature" and result.suggestion == SAFETY * result.limit
    assert result.limit == pytest.approx(stable, rel=0.2)  # 8 batches of 32: the estimate
    assert result.curvature == pytest.approx(2 / result.limit)
    assert result.reached and result.notes == []
    assert result.diverged and result.limit < result.lrs[-1] < 100.0
    assert len(result.ratios) == len(result.lrs)
    measured = [r for lr, r in zip(result.lrs, result.ratios) if 1e-3 < lr < 0.1]
    assert measured and all(0.8 < r < 1.05 for r in measured)  # small steps do as promised
    for name, tensor in subject.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert [dict(g, params=None) for g in subject.optimizer.param_groups] == groups_before
    assert all(p.grad is None for p in subject.model.parameters())

    saved = json.loads((tmp_path / "lr-find.json").read_text())
    assert saved["format"] == "ember-lr-find" and saved["version"] == 3
    assert saved["lrs"] == result.lrs and saved["suggestion"] == result.suggestion
    loaded = LrFinderResult.load(result.path)
    assert loaded.smoothed == pytest.approx(result.smoothed)
    assert (loaded.edge, loaded.limit, loaded.curvature) == (
        result.edge,
        result.limit,
        result.curvature,
    )
    assert loaded.rule == "curvature" and loaded.ratios == pytest.approx(result.ratios, nan_ok=True)


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


def least_squares(condition, samples=1024, features=8, top=16.0, batch=32, seed=0):
    """Inputs whose mean-squared-error Hessian 2 X^T X / n has the eigenvalues `top` down
    to `top / condition` (log-spaced), targets from a random linear map plus noise: the
    shuffled mini-batches of `batch`, and the whole (x, y)."""
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(features, features, generator=generator))
    eigenvalues = torch.logspace(math.log10(top), math.log10(top / condition), features)
    z = torch.randn(samples, features, generator=generator)
    z = torch.linalg.qr(z - z.mean(0))[0] * math.sqrt(samples)  # z^T z / n = I
    x = z @ torch.diag(torch.sqrt(eigenvalues / 2)) @ basis.T
    y = x @ torch.randn(features, 1, generator=generator)
    y = y + 0.1 * torch.randn(samples, 1, generator=generator)
    order = torch.randperm(samples, generator=generator)
    batches = [(x[order[i : i + batch]], y[order[i : i + batch]]) for i in range(0, samples, batch)]
    return batches, (x, y)


def largest_stable_rate(x):
    """Gradient descent on the mean squared error of a linear map of `x` is stable below
    2 / the largest eigenvalue of its Hessian 2 X^T X / n."""
    return 2 / float(torch.linalg.eigvalsh(2 * x.T @ x / len(x)).max())


class NoBias(Linear):
    def __init__(self, features=8):
        super().__init__()
        self.net = nn.Linear(features, 1, bias=False)


def gradient_descent(model, batches, lr, steps, optimizer=torch.optim.SGD):
    """`steps` steps of `optimizer` at `lr` through `batches` (in turn): every loss (the
    list ends with inf once a loss is not finite or past 1e6 times the first)."""
    optimizer = optimizer(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        loss = model.train_step(batches[step % len(batches)]).item.loss
        value = loss.item()
        if not math.isfinite(value) or (losses and value > 1e6 * losses[0]):
            return losses + [math.inf]
        losses.append(value)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return losses


def find(tmp_path, model, batches, optimizer=None, **options):
    """The range test of `model` on `batches` with SGD (or `optimizer`, a config) and
    the default rates (1e-7 to 10 in 100 steps)."""
    subject = (
        LearnerBuilder(tmp_path / "find", overwrite=True)
        .renderer(PlainRenderer(interval=3600))
        .build(model, (optimizer or SgdConfig()).init(), 0.01)
    )
    return subject.lr_find(batches, **options)


@pytest.mark.parametrize("whole", [True, False], ids=["full-batch", "mini-batch"])
@pytest.mark.parametrize("condition", [2, 5, 12, 125])
def test_on_least_squares_the_suggestion_is_within_2x_below_the_largest_stable_rate(
    tmp_path, one_thread, condition, whole
):
    """The largest stable rate of gradient descent is 2 / the Hessian's largest
    eigenvalue (checked: it converges at 0.95 times it and diverges at 1.05 times). The
    suggestion lies within 2x below it, with the whole data in one batch and with
    mini-batches of 32 (where the curvature is measured on 8 of the 32 batches); SGD on
    those mini-batches trains at it. (The rule before, half the rate at which the
    rising rate's steps stopped gaining, suggested 1.2 to 2.0 times this limit with the
    whole data in one batch.)"""
    batches, (x, y) = least_squares(condition)
    stable = largest_stable_rate(x)
    everything = [(x, y)]
    torch.manual_seed(1)
    converging = gradient_descent(NoBias(), everything, 0.95 * stable, 400)
    assert converging[-1] < 0.05 * converging[0]
    torch.manual_seed(1)
    assert gradient_descent(NoBias(), everything, 1.05 * stable, 400)[-1] == math.inf

    torch.manual_seed(0)
    result = find(tmp_path, NoBias(), everything if whole else batches)
    assert stable / 2 <= result.suggestion <= stable, result.suggestion / stable
    assert result.rule == "curvature" and result.reached and result.notes == []
    if whole:  # the Hessian of the one batch is the problem's: its eigenvalue, exactly
        assert result.limit == pytest.approx(stable, rel=1e-3)
    torch.manual_seed(1)
    losses = gradient_descent(NoBias(), everything if whole else batches, result.suggestion, 320)
    assert losses[-1] < 0.05 * losses[0]  # down to the noise (0.01) from about 10


def mlp(seed):
    """Linear(8, 64), tanh, Linear(64, 64), tanh, Linear(64, 1), its weights from `seed`."""
    torch.manual_seed(seed)
    return Regressor(
        nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    )


class Regressor(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def train_step(self, batch):
        x, y = batch
        predicted = self.net(x)
        return TrainOutput(RegressionOutput(F.mse_loss(predicted, y), predicted, y))


def wave(samples=512, seed=1):
    """A smooth regression in 8 dimensions: 8 fixed batches of 64."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=generator)
    y = torch.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    y = y + 0.1 * torch.randn(samples, 1, generator=generator)
    return [(x[i : i + 64], y[i : i + 64]) for i in range(0, samples, 64)]


def trains(losses):
    """400 steps train: every loss finite and at most twice the first, and the last 8
    below the first on average."""
    first = losses[0]
    return all(math.isfinite(v) and v <= 2 * first for v in losses) and (
        sum(losses[-8:]) / 8 < first
    )


def largest_trained_rate(make, batches, optimizer, first):
    """The largest rate of a grid (10 per decade, from `first`, which must train) at
    which 400 steps of `optimizer` train the model `make()` makes (`trains`)."""
    best = None
    for k in range(60):
        lr = first * 10 ** (k / 10)
        if not trains(gradient_descent(make(), batches, lr, 400, optimizer)):
            break
        best = lr
    assert best is not None, f"the grid's first rate {first} does not train"
    return best


@pytest.mark.parametrize(
    ("name", "optimizer", "config", "first"),
    [
        ("SGD", torch.optim.SGD, SgdConfig(), 0.1),
        ("Adam", lambda params, lr: torch.optim.Adam(params, lr=lr, eps=1e-5), AdamConfig(), 0.01),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_an_mlp_the_suggestion_is_within_2x_below_the_largest_rate_that_trains(
    tmp_path, one_thread, seed, name, optimizer, config, first
):
    """The limit established by training: the largest rate of a grid (10 per decade)
    at which 400 steps on the 8 batches stay below twice the first loss and end below
    it (the next rate of the grid does not). (The rule before suggested 1.1 times it
    with SGD, 1.7 to 2.1 times it with Adam.)"""
    batches = wave()
    stable = largest_trained_rate(lambda: mlp(seed), batches, optimizer, first)
    result = find(tmp_path, mlp(seed), batches, config)
    assert result.rule == "curvature"
    assert stable / 2 <= result.suggestion <= stable, (result.suggestion / stable, stable)
    assert trains(gradient_descent(mlp(seed), batches, result.suggestion, 400, optimizer))


@pytest.mark.parametrize("end", [0.05, 0.5, 1.0, 1.9, 10.0])
def test_whatever_the_end_of_the_range_the_suggestion_is_safe_and_a_short_range_says_so(
    tmp_path, one_thread, end
):
    """Least squares of condition 2 whose largest stable rate is 2: rates that stop
    below it do not show the edge, and the result says so; the suggestion is the same
    whatever the range. (The rule before suggested 0.03 to
    0.25 times the limit when the rates stopped below it, 1.4 times it up to 10.)"""
    _, (x, y) = least_squares(2, top=1.0)
    stable = largest_stable_rate(x)
    assert stable == pytest.approx(2.0, rel=1e-4)
    torch.manual_seed(0)
    result = find(tmp_path, NoBias(), [(x, y)], end=end)
    assert stable / 2 <= result.suggestion <= stable
    assert result.suggestion == pytest.approx(SAFETY * stable, rel=1e-3)
    if end < stable:
        assert not result.reached and not result.diverged
        (note,) = result.notes
        assert f"the rates stopped at {end:.4g}, below the largest stable rate 2" in note
        assert "raise `end`" in note
    else:
        assert result.reached and result.notes == []


def test_the_smoothed_loss_follows_the_losses_without_lag_and_one_spike_does_not_move_it():
    """The loss falls from 30 to 1 in three steps and one batch spikes to 100: the
    smoothed loss is 1 where the losses are (the bias-corrected moving average with
    factor 0.98 used before was 9.3 five steps after the fall, 8.8 after the spike, 4.0
    at the end), and every smoothed value lies among its neighbours' losses."""
    generator = torch.Generator().manual_seed(0)
    losses = [30.0, 20.0, 5.0] + [
        1 + 0.05 * float(torch.randn(1, generator=generator)) for _ in range(40)
    ]
    losses[20] = 100.0
    smoothed = smooth(losses, 0.8)
    assert all(abs(v - 1) < 0.1 for v in smoothed[5:])
    for index, value in enumerate(smoothed):
        around = losses[max(0, index - 3) : index + 4]
        assert min(around) <= value <= max(around), index
    assert smooth(losses, 0.0) == losses
    assert math.isnan(smooth([1.0, 2.0, math.inf], 0.8)[2])


def draw(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.canvas.draw()
    return figure.canvas.get_renderer()


@pytest.mark.parametrize("optimizer", [SgdConfig(), AdamConfig()], ids=["SGD", "Adam"])
def test_the_picture_puts_the_suggestion_below_the_unstable_rates(tmp_path, one_thread, optimizer):
    """On the MLP: the rates past the largest stable rate are shaded, and the suggestion's
    rule lies left of the shading, as the steps' edge lies right of its start; the
    smoothed curve runs among the raw losses; "lowest" marks the smoothed curve."""
    from ember.plot import lr_find_figure

    result = find(tmp_path, mlp(0), wave(), optimizer)
    assert result.rule == "curvature" and result.reached
    figure = lr_find_figure(result.path)
    renderer = draw(figure)
    ax = figure.axes[0]
    (shade,) = [p for p in ax.patches if p.get_width() > 0]
    shaded = shade.get_window_extent(renderer)
    box = ax.get_window_extent(renderer)
    assert shaded.x1 == pytest.approx(box.x1, abs=1)  # to the right edge of the axes

    def rule_at(value):
        (_,) = [
            line
            for line in ax.lines
            if line.get_transform() != ax.transData and list(line.get_xdata()) == [value, value]
        ]
        return ax.transData.transform([(value, 1.0)])[0, 0]

    assert rule_at(result.limit) == pytest.approx(shaded.x0, abs=1)
    assert box.x0 < rule_at(result.suggestion) < shaded.x0 - 10
    assert rule_at(result.edge) > shaded.x0
    # the smoothed curve runs among the raw losses, no lag
    by_label = {line.get_label(): line for line in ax.lines}
    raw = list(by_label["loss"].get_ydata())
    smoothed = list(by_label["smoothed loss"].get_ydata())
    for index, value in enumerate(smoothed):
        around = [v for v in raw[max(0, index - 3) : index + 4] if math.isfinite(v)]
        assert not math.isfinite(value) or min(around) <= value <= max(around), index
    # "lowest" reads the smoothed curve
    (lowest,) = [line for line in ax.lines if line.get_marker() == "v"]
    at = min(
        range(len(smoothed)), key=lambda i: smoothed[i] if math.isfinite(smoothed[i]) else math.inf
    )
    assert list(lowest.get_xydata()[0]) == pytest.approx([result.lrs[at], smoothed[at]])
    assert lowest.get_label().startswith("lowest smoothed loss ")
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert f"({SAFETY:g} x largest stable rate)" in legend and "unstable rates" in legend


def test_a_short_range_is_drawn_with_the_suggestion_and_the_shading_past_its_end(
    tmp_path, one_thread
):
    """Rates that stop below the largest stable rate: the axis reaches on to the
    suggestion and the shading, and the title says the rates stop short."""
    from ember.plot import lr_find_figure

    _, (x, y) = least_squares(2, top=1.0)
    torch.manual_seed(0)
    result = find(tmp_path, NoBias(), [(x, y)], end=0.05)
    figure = lr_find_figure(result.path)
    renderer = draw(figure)
    ax = figure.axes[0]
    (shade,) = [p for p in ax.patches if p.get_width() > 0]
    suggestion = ax.transData.transform([(result.suggestion, 1.0)])[0, 0]
    box = ax.get_window_extent(renderer)
    assert box.x0 < suggestion < shade.get_window_extent(renderer).x0 < box.x1
    assert "the rates stop below the largest stable rate" in figure.get_suptitle()


class Slope(torch.autograd.Function):
    """tanh's slope times the incoming gradient, without a derivative of its own."""

    @staticmethod
    def forward(ctx, grad, y):
        return grad * (1 - y * y)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("the derivative for 'Slope' is not implemented")


class Once(torch.autograd.Function):
    """tanh, whose backward can be run but not differentiated (as some fused kernels)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return Slope.apply(grad, y)


class OnceMlp(Regressor):
    def train_step(self, batch):
        x, y = batch
        predicted = self.net[2](Once.apply(self.net[0](x)))
        return TrainOutput(RegressionOutput(F.mse_loss(predicted, y), predicted, y))


@pytest.mark.parametrize("case", ["optimizer without a rule", "no second derivative", "off"])
def test_without_a_curvature_the_suggestion_is_read_from_the_curve_and_the_notes_say_why(
    tmp_path, one_thread, case
):
    batches = wave()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    if case == "optimizer without a rule":
        model = Regressor(net)
        subject = (
            LearnerBuilder(tmp_path)
            .renderer(PlainRenderer(interval=3600))
            .build(model, torch.optim.RMSprop(model.parameters()), 0.01)
        )
        result = subject.lr_find(batches)
        (note,) = result.notes
        assert "no stability rule for RMSprop" in note and "SGD, Adam and AdamW" in note
    elif case == "no second derivative":
        result = find(tmp_path, OnceMlp(net), batches)
        (note,) = result.notes
        assert note.startswith("the curvature could not be measured (the derivative for 'Slope'")
    else:
        result = find(tmp_path, Regressor(net), batches, curvature_batches=0)
        assert result.notes == []
    assert result.curvature is None and result.limit is None
    assert result.rule == "half the edge" and result.suggestion == result.edge / 2


def test_a_curve_that_diverges_below_the_limit_lowers_the_suggestion_and_says_so(
    tmp_path, one_thread
):
    """The twelfth batch has a target that is not a number: the curve stops there, at a
    rate far below the largest stable rate, and the suggestion follows it down."""
    batches, _ = least_squares(12)
    x, y = batches[11]
    batches[11] = (x, torch.full_like(y, math.nan))
    torch.manual_seed(0)
    result = find(tmp_path, NoBias(), batches)
    assert result.diverged and len(result.lrs) == 12 and result.lrs[-1] < result.limit
    assert result.suggestion == pytest.approx(SAFETY * result.lrs[-1])
    (note,) = result.notes
    assert note.startswith(f"the curve diverged at {result.lrs[-1]:.4g}, below the largest")


def test_a_range_test_of_an_earlier_version_still_loads(tmp_path):
    path = tmp_path / "lr-find.json"
    path.write_text(
        json.dumps(
            {
                "format": "ember-lr-find",
                "version": 2,
                "mode": "exp",
                "lrs": [0.1, 1.0],
                "losses": [1.0, 2.0],
                "smoothed": [1.0, 1.5],
                "ratios": [0.9, -1.0],
                "edge": 1.0,
                "suggestion": 0.5,
                "diverged": False,
            }
        )
    )
    result = LrFinderResult.load(path)
    assert (result.rule, result.limit, result.notes, result.reached) == (
        "half the edge",
        None,
        [],
        True,
    )


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
        ({"curvature_batches": -1}, "curvature_batches=...\\) must be an int >= 0"),
    ],
)
def test_options_that_cannot_work_are_refused(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        learner(tmp_path).lr_find(regression(), **options)
    assert not (tmp_path / "lr-find.json").exists()
