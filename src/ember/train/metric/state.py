"""Per-split metric state: values waiting on the device, then host rows for the epoch."""

from __future__ import annotations

from typing import Any

import torch

from ember.train.metric.base import metric_unit, weighted_mean


class MetricState:
    """One registered metric in one split. Values on an accelerator are kept as they
    come and moved to the host in bulk by `MetricsProcessor`; host values are read at once."""

    def __init__(self, metric: Any, numeric: bool) -> None:
        self.metric = metric
        self.name: str = str(metric.name)
        self.unit = metric_unit(metric)
        self.numeric = numeric
        self.input_type: type = metric.input_type
        self.pending: list[tuple[int, Any, Any, Any]] = []
        """(iteration, value, weight, factor): host numbers, or tensors still on a device;
        the factor is the scale, or (scale, divisor) when the value is divided."""
        self.rows: list[tuple[float, float]] = []
        self.last: float | str | None = None
        self._sum = 0.0
        self._weight = 0.0
        self.shared = 0  # rows already exchanged between processes

    def clear(self) -> None:
        self.metric.clear()
        self.pending.clear()
        self.rows = []
        self.shared = 0
        self.last = None
        self._sum = 0.0
        self._weight = 0.0

    def add_rows(self, rows: list[tuple[float, float]]) -> None:
        self.rows.extend(rows)
        for value, weight in rows:
            self._sum += value * weight
            self._weight += weight
        if rows:
            self.last = rows[-1][0]

    @property
    def running(self) -> float | None:
        """The epoch so far (weighted mean), for display."""
        return self._sum / self._weight if self._weight > 0 else None

    def epoch_value(self) -> float | None:
        """The epoch's value: the metric's own `epoch_value()`, or the weighted mean of
        the rows, computed exactly as readers of the log files compute it."""
        own = getattr(self.metric, "epoch_value", None)
        if callable(own):
            value = own()
            if value is None:
                return None
            if isinstance(value, torch.Tensor):
                return float(value.detach().double().cpu())
            return float(value)
        if not self.rows:
            return None
        return weighted_mean(self.rows)


def to_host(values: list[Any]) -> list[float]:
    """Numbers and scalar tensors as floats, with one transfer per device and dtype."""
    out: list[float] = [0.0] * len(values)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            groups.setdefault((value.device, value.dtype), []).append(index)
        else:
            out[index] = float(value)
    for indexes in groups.values():
        stacked = torch.stack([values[i].detach().reshape(()) for i in indexes])
        for i, number in zip(indexes, stacked.to("cpu").double().tolist()):
            out[i] = number
    return out
