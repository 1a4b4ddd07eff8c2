"""Regression metrics: MAE, MSE, RMSE and R², with exact epoch values.

Each update reduces its batch, on the batch's device, to a few sums per output column
(sample count, absolute and squared errors, the targets' mean and sum of squared
deviations); the epoch keeps their running totals, merged across processes. The
iteration value is the metric of the batch alone; the epoch value is computed once,
from the totals, so it equals the metric of the whole epoch's predictions (the RMSE
of the epoch is the root of its mean squared error, not a mean of batch RMSEs).

Predictions and targets have one shape, [N] or [N, ...]: row i is sample i and every
other element is one output (a [N, 3] output has 3 outputs, an image [N, C, H, W]
has C * H * W). [N] and [N, 1] are the same single output. Several outputs are
reduced as scikit-learn's default `multioutput="uniform_average"` does: the metric of
each output, then their plain mean (for MAE and MSE this equals the mean over every
element; for RMSE and R² it is the mean of the per-output RMSEs and R²s).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.metric._common import dims, wide_float
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import RegressionInput

_EXPECTS = "predictions and targets of one shape, [N] or [N, ...]"


class Sums(NamedTuple):
    """Per-output totals [D] of a set of samples (`samples` is a scalar tensor)."""

    samples: torch.Tensor
    abs_error: torch.Tensor
    sq_error: torch.Tensor
    mean: torch.Tensor  # of the targets
    m2: torch.Tensor  # sum of the targets' squared deviations from their mean

    def merged(self, other: Sums) -> Sums:
        """The totals of both sets (Chan et al.'s pairwise update of the mean and M2)."""
        count = self.samples + other.samples
        delta = other.mean - self.mean
        share = other.samples / count.clamp(min=1)
        return Sums(
            count,
            self.abs_error + other.abs_error,
            self.sq_error + other.sq_error,
            self.mean + delta * share,
            self.m2 + other.m2 + delta * delta * self.samples * share,
        )

    def to(self, device: torch.device | str) -> Sums:
        return Sums(*(t.to(device) for t in self))


def batch_sums(output: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype) -> Sums:
    """The totals of one batch, [N, D] predictions and targets, in `dtype`."""
    output, targets = output.to(dtype), targets.to(dtype)
    error = output - targets
    mean = targets.mean(dim=0)
    deviation = targets - mean
    return Sums(
        torch.tensor(float(targets.shape[0]), dtype=dtype, device=targets.device),
        error.abs().sum(dim=0),
        (error * error).sum(dim=0),
        mean,
        (deviation * deviation).sum(dim=0),
    )


class _RegressionMetric:
    """Shared machinery: per-output sums of each batch, totalled over the epoch."""

    unit = ""
    higher_is_better = False
    input_type = RegressionInput
    _label = ""

    def __init__(self, name: str | None = None) -> None:
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"{type(self).__name__}: name must be a string, got {name!r}.")
        self.name = name if name is not None else self._label
        self._total: Sums | None = None

    def update(self, input: RegressionInput, meta: MetricMetadata) -> MetricValue:
        output, targets = self._columns(input)
        sums = batch_sums(output, targets, wide_float(output.device))
        if self._total is None:
            self._total = sums
        elif self._total.mean.shape != sums.mean.shape:
            raise TrainingError(
                f"{type(self).__name__} reads {self._total.mean.shape[0]} outputs per sample "
                f"this epoch, but a batch has predictions {dims(input.output.shape)}: every "
                "batch needs the same number of outputs per sample."
            )
        else:
            self._total = self._total.merged(sums)
        return MetricValue(self.score(sums), int(output.shape[0]))

    def epoch_value(self) -> torch.Tensor | float:
        """The metric of every sample seen since the last `clear()`."""
        return math.nan if self._total is None else self.score(self._total)

    def clear(self) -> None:
        self._total = None

    def epoch_state(self) -> list[torch.Tensor] | None:
        """This process's totals, as a list of tensors (exchanged when training on
        several processes, and kept by a checkpoint taken mid-epoch)."""
        return None if self._total is None else list(self._total.to("cpu"))

    def merge_epoch_states(self, states: list[Sequence[torch.Tensor] | None]) -> None:
        """Add other processes' totals, so `epoch_value` covers every sample."""
        for state in states:
            if state is None:
                continue
            sums = Sums(*state)
            if self._total is None:
                self._total = sums
            else:
                self._total = self._total.merged(sums.to(self._total.samples.device))

    def score(self, sums: Sums) -> torch.Tensor:
        """The metric of a set of samples from its totals (uniform mean over outputs)."""
        raise NotImplementedError

    def _columns(self, input: RegressionInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictions and targets as [N, D] floating-point tensors."""
        output, targets = input.output.detach(), input.targets.detach()
        same = output.shape == targets.shape
        if not same and output.dim() >= 1 and targets.dim() >= 1:
            # [N] against [N, 1] (or the reverse): one output either way.
            same = output.shape[0] == targets.shape[0] and output.numel() == targets.numel()
            same = same and output.numel() == output.shape[0]
        if not same or output.dim() == 0:
            fix = "give one prediction per target"
            if output.dim() >= 1 and targets.dim() >= 1 and output.shape[0] != targets.shape[0]:
                fix = "they must hold one row per sample"
            elif output.dim() == 0:
                fix = "return predictions with a batch dimension"
            raise TrainingError(
                f"{type(self).__name__} reads {_EXPECTS}; got predictions "
                f"{dims(output.shape)} and targets {dims(targets.shape)}: {fix} (a "
                "broadcast between the two shapes would compare every prediction with "
                "every target)."
            )
        if not output.is_floating_point():
            raise TrainingError(
                f"{type(self).__name__} reads floating-point predictions; got "
                f"{output.dtype}. Return the model's predictions as floats."
            )
        rows = int(output.shape[0])
        return output.reshape(rows, -1), targets.reshape(rows, -1)


class MaeMetric(_RegressionMetric):
    """Mean absolute error, mean |prediction - target|, in the targets' unit."""

    _label = "MAE"

    def score(self, sums: Sums) -> torch.Tensor:
        return (sums.abs_error / sums.samples).mean()


class MseMetric(_RegressionMetric):
    """Mean squared error, mean (prediction - target)², in the targets' unit squared."""

    _label = "MSE"

    def score(self, sums: Sums) -> torch.Tensor:
        return (sums.sq_error / sums.samples).mean()


class RmseMetric(_RegressionMetric):
    """Root mean squared error, in the targets' unit. The epoch value is the root of the
    epoch's mean squared error (per output, then their mean), not a mean of batch RMSEs."""

    _label = "RMSE"

    def score(self, sums: Sums) -> torch.Tensor:
        return (sums.sq_error / sums.samples).sqrt().mean()


class R2Metric(_RegressionMetric):
    """Coefficient of determination R² = 1 - SSE / SST (SST: the targets' squared
    deviations from their mean over the set scored), unitless, at most 1.

    The epoch value is the R² of the whole epoch, computed from the epoch's totals (not
    a mean of batch R²s). As in scikit-learn: an output whose targets are all equal
    scores 1 when predicted exactly and 0 otherwise, and a set of fewer than two
    samples has no R² (NaN).
    """

    _label = "R2"
    higher_is_better = True

    def score(self, sums: Sums) -> torch.Tensor:
        constant = sums.m2 == 0
        ratio = sums.sq_error / torch.where(constant, 1.0, sums.m2)
        per_output = torch.where(constant, (sums.sq_error == 0).to(ratio.dtype), 1.0 - ratio)
        value = per_output.mean()
        return torch.where(sums.samples < 2, math.nan, value)
