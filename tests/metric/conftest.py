"""Fixtures for the metric tests: drive a metric through an epoch as the loop does."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import pytest
import torch

from ember.train.metric.adapt import adapt
from ember.train.metric.base import MetricMetadata, MetricValue

Driver = Callable[..., "tuple[float, list[MetricValue]]"]


def _to_float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _run_epoch(metric: Any, outputs: Sequence[Any], epoch: int) -> tuple[float, list[MetricValue]]:
    metric.clear()
    values = []
    for i, output in enumerate(outputs):
        item = adapt(output, metric.input_type, metric.name)
        meta = MetricMetadata("train", epoch, 2, i, len(outputs), 1e-3 * (i + 1))
        values.append(metric.update(item, meta))
    if callable(getattr(metric, "epoch_value", None)):
        return _to_float(metric.epoch_value()), values
    rows = [v.resolve() for v in values]
    total = math.fsum(weight for _, weight in rows)
    mean = math.fsum(value * weight for value, weight in rows) / total
    return mean, values


@pytest.fixture
def drive() -> Driver:
    """`drive(metric, outputs, warmup=None)`: clear, update once per output (adapted
    through `adapt`), then the epoch value (`epoch_value()` if defined, else the
    weight-weighted mean of the iteration values). A `warmup` epoch run first checks
    that `clear()` forgets it. Returns (epoch value, iteration values)."""

    def go(
        metric: Any, outputs: Sequence[Any], warmup: Sequence[Any] | None = None
    ) -> tuple[float, list[MetricValue]]:
        if warmup is not None:
            _run_epoch(metric, warmup, epoch=0)
        return _run_epoch(metric, outputs, epoch=1)

    return go
