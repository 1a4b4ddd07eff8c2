"""The metric protocol: a tiny reset / update / name contract.

A metric turns one step's output into a value for that iteration. Values may be
tensors on the device: ember moves them to the host in bulk, never one `.item()`
per iteration. The epoch value of a numeric metric is the weighted mean of its
iteration values (weight = batch size unless the metric says otherwise), unless
the metric defines `epoch_value()` (e.g. AUROC, which needs the whole epoch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Sequence, Union, runtime_checkable

import torch

Number = Union[torch.Tensor, float, int]


class MetricMetadata(NamedTuple):
    """Where the loop stands when a metric is updated (a tuple: made every iteration)."""

    split: str
    epoch: int
    num_epochs: int
    iteration: int
    num_iterations: int | None
    lr: float | None


class MetricValue(NamedTuple):
    """One iteration's value and its weight in the epoch mean (usually the batch size).

    `value` may be a tensor on the device, a number, or a string (text metrics). The
    value reported is `value * scale / divisor`, taken on the host in float64: a
    metric can return an exact count (e.g. correct predictions) with a host-side
    factor and divisor (100 and the batch size for a percentage), saving device work
    and giving the correctly rounded figure. (A named tuple: one is made per metric
    and iteration, so it must be cheap.)
    """

    value: Number | str
    weight: Number = 1
    scale: float = 1.0
    divisor: float = 1.0

    def resolve(self) -> tuple[float | str, float]:
        """`(value * scale / divisor, weight)` as host numbers (syncs; for hand-written
        loops and tests)."""
        weight = (
            float(self.weight.item())
            if isinstance(self.weight, torch.Tensor)
            else float(self.weight)
        )
        if isinstance(self.value, str):
            return self.value, weight
        value = (
            float(self.value.double().item())
            if isinstance(self.value, torch.Tensor)
            else float(self.value)
        )
        if self.divisor != 1.0:
            return value * self.scale / self.divisor, weight
        return value * self.scale, weight


@runtime_checkable
class Metric(Protocol):
    """A metric. `name` is stable: it names the metric's log file."""

    name: str
    input_type: type

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        """Read one step's (adapted) output; return this iteration's value."""
        ...

    def clear(self) -> None:
        """Forget everything: called at the start of every epoch."""
        ...


def metric_unit(metric: Any) -> str:
    """The unit a metric reports in ("%" for accuracies, "" when unitless)."""
    return str(getattr(metric, "unit", ""))


def weighted_mean(rows: Sequence[tuple[float, float]]) -> float:
    """An epoch value from iteration rows: the weight-weighted mean of `(value, weight)`,
    summed exactly (NaN when the weights add up to zero)."""
    total = math.fsum(weight for _, weight in rows)
    if total == 0:
        return math.nan
    return math.fsum(value * weight for value, weight in rows) / total


@dataclass(frozen=True)
class RegisteredMetric:
    """A metric registered for one split; `numeric` ones are plotted too."""

    metric: Metric
    numeric: bool

    @property
    def name(self) -> str:
        return str(self.metric.name)

    @property
    def unit(self) -> str:
        return metric_unit(self.metric)
