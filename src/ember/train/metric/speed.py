"""Training throughput in items per second."""

from __future__ import annotations

import math
import time

from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import LossInput


class IterationSpeedMetric:
    """Items (samples of the batch dimension) per second since the epoch started.

    Host wall-clock timing only: it never waits for the accelerator, so single values
    may run ahead of the device, but the running rate settles on the true throughput.
    The iteration value is the running rate (weight 1); the epoch value is the rate at
    the last iteration: all items of the epoch over the time they took.
    """

    name = "Iteration Speed"
    unit = "item/s"
    higher_is_better = True
    input_type = LossInput  # every standard output provides it, with its batch size

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._items = 0
        self._rate = math.nan

    def update(self, input: LossInput, meta: MetricMetadata) -> MetricValue:
        self._items += int(input.batch_size)
        elapsed = time.perf_counter() - self._start
        self._rate = self._items / elapsed if elapsed > 0 else math.nan
        return MetricValue(self._rate, 1)

    def epoch_value(self) -> float:
        """Items of the epoch per second, up to its last iteration."""
        return self._rate

    def clear(self) -> None:
        self._start = time.perf_counter()
        self._items = 0
        self._rate = math.nan

    def epoch_state(self) -> tuple[int, float]:
        """Items seen and seconds taken by this process (exchanged across processes)."""
        return self._items, time.perf_counter() - self._start

    def merge_epoch_states(self, states: list[tuple[int, float]]) -> None:
        """Every process's items over the slowest one's time: the run's throughput."""
        items, elapsed = self.epoch_state()
        for other_items, other_elapsed in states:
            items += other_items
            elapsed = max(elapsed, other_elapsed)
        self._rate = items / elapsed if elapsed > 0 else math.nan
