"""MAE, MSE, RMSE and R² against scikit-learn, per iteration and per epoch."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from ember.errors import TrainingError
from ember.train.metric import MaeMetric, MseMetric, R2Metric, RmseMetric
from ember.train.output import RegressionOutput

SIZES = [32, 32, 32, 7]  # an uneven last batch
N = sum(SIZES)
ZERO = torch.tensor(0.0)


def _rmse(y, p):
    return mean_squared_error(y, p, multioutput="raw_values") ** 0.5


REFERENCES = {
    MaeMetric: mean_absolute_error,
    MseMetric: mean_squared_error,
    RmseMetric: lambda y, p: float(_rmse(y, p).mean()),  # sklearn's uniform average
    R2Metric: r2_score,
}


def _data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    targets = torch.randn(*shape, generator=g) * 3 + 1
    output = targets + torch.randn(*shape, generator=g) * torch.linspace(0.5, 2.0, shape[-1])
    return output, targets


@pytest.mark.parametrize("metric_type", list(REFERENCES))
@pytest.mark.parametrize("shape", [(N,), (N, 1), (N, 3)])
def test_against_scikit_learn(drive, metric_type, shape):
    output, targets = _data(shape, seed=len(shape) * 10 + shape[-1])
    batches = [
        RegressionOutput(ZERO, x, y) for x, y in zip(output.split(SIZES), targets.split(SIZES))
    ]
    warmup = [RegressionOutput(ZERO, targets, output)]  # a first epoch clear() forgets
    value, values = drive(metric_type(), batches, warmup=warmup)
    reference = REFERENCES[metric_type]
    y, p = targets.double().numpy(), output.double().numpy()
    assert value == pytest.approx(reference(y, p), rel=1e-9)
    start = 0
    for size, iteration in zip(SIZES, values):
        batch = slice(start, start + size)
        assert float(iteration.value) == pytest.approx(reference(y[batch], p[batch]), rel=1e-9)
        assert iteration.weight == size
        start += size


def test_rmse_epoch_is_the_root_of_the_epoch_mse(drive):
    output = torch.tensor([0.0, 0.0, 0.0, 10.0])
    targets = torch.zeros(4)
    batches = [RegressionOutput(ZERO, output[:2], targets[:2])]
    batches.append(RegressionOutput(ZERO, output[2:], targets[2:]))
    value, values = drive(RmseMetric(), batches)
    assert value == pytest.approx(5.0)  # sqrt(100 / 4), not the mean of 0 and sqrt(50)
    assert [float(v.value) for v in values] == pytest.approx([0.0, math.sqrt(50)])


def test_r2_constant_targets_and_single_sample(drive):
    targets = torch.full((4,), 2.0)
    exact, _ = drive(R2Metric(), [RegressionOutput(ZERO, targets.clone(), targets)])
    off, _ = drive(R2Metric(), [RegressionOutput(ZERO, targets + 1, targets)])
    assert (exact, off) == (1.0, 0.0)  # scikit-learn's force_finite convention
    assert (exact, off) == (r2_score(targets, targets), r2_score(targets, targets + 1))
    one, _ = drive(R2Metric(), [RegressionOutput(ZERO, torch.ones(1), torch.zeros(1))])
    assert math.isnan(one)


def test_states_merge_as_one_epoch(drive):
    output, targets = _data((N, 2), seed=5)
    whole, _ = drive(R2Metric(), [RegressionOutput(ZERO, output, targets)])
    first, second = R2Metric(), R2Metric()
    drive(first, [RegressionOutput(ZERO, output[:40], targets[:40])])
    drive(second, [RegressionOutput(ZERO, output[40:], targets[40:])])
    first.merge_epoch_states([second.epoch_state()])
    assert float(first.epoch_value()) == pytest.approx(whole, rel=1e-12)


@pytest.mark.parametrize(
    ("output", "targets", "message"),
    [
        (torch.zeros(4, 1), torch.zeros(4, 2), "give one prediction per target"),
        (torch.zeros(4), torch.zeros(5), "one row per sample"),
        (torch.zeros(4, 3), torch.zeros(4), "broadcast"),
        (torch.zeros(4, dtype=torch.long), torch.zeros(4), "floating-point"),
    ],
)
def test_bad_shapes_are_named(drive, output, targets, message):
    with pytest.raises(TrainingError, match=message):
        drive(MseMetric(), [RegressionOutput(ZERO, output, targets)])


def test_outputs_per_sample_must_not_change(drive):
    batches = [RegressionOutput(ZERO, torch.zeros(4, 2), torch.zeros(4, 2))]
    batches.append(RegressionOutput(ZERO, torch.zeros(4, 3), torch.zeros(4, 3)))
    with pytest.raises(TrainingError, match="same number of outputs per sample"):
        drive(MaeMetric(), batches)
