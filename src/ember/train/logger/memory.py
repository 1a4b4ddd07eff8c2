"""A metric logger that keeps every value in memory, for tests and notebooks."""

from __future__ import annotations

from typing import Sequence

from ember.train.logger.base import MetricRecord, RunStart


class InMemoryMetricLogger:
    """Keeps iteration values and epoch aggregates in dicts keyed by split, then metric.

    `values[split][name]` lists `(epoch, iteration, value, weight)` in arrival order and
    `epochs[split][name]` lists `(epoch, aggregate)`. `close()` only sets `closed`: the
    data stays, and a later run may keep logging into the same instance. A resumed
    run (`start_run`) first forgets what came after its checkpoint, so the values it
    logs again are not held twice. Under several processes each iteration's value
    is held once per process, every one with the iteration's number.
    """

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[tuple[int, int, float, float]]]] = {}
        self.epochs: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self.closed = False

    def start_run(self, run: RunStart) -> None:
        """A resumed run: forget the values that came after its checkpoint."""
        if not run.resumed:
            return
        for split, metrics in self.values.items():
            for name, values in metrics.items():
                metrics[name] = [v for v in values if run.keeps(split, v[0], v[1])]
        for split, epochs in self.epochs.items():
            for name, aggregates in epochs.items():
                epochs[name] = [a for a in aggregates if run.keeps(split, a[0])]

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Append each record to its metric's list."""
        metrics = self.values.setdefault(split, {})
        for record in records:
            metrics.setdefault(record.name, []).append(
                (epoch, record.iteration, float(record.value), float(record.weight))
            )

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """Append each epoch aggregate to its metric's list."""
        metrics = self.epochs.setdefault(split, {})
        for name, value in aggregates.items():
            metrics.setdefault(name, []).append((epoch, float(value)))

    def close(self) -> None:
        """Mark the logger closed; the data is kept."""
        self.closed = True

    def series(self, split: str, name: str) -> list[float]:
        """The iteration values of one metric of one split, in order (empty if none)."""
        return [value for _, _, value, _ in self.values.get(split, {}).get(name, [])]

    def clear(self) -> None:
        """Forget everything logged so far."""
        self.values.clear()
        self.epochs.clear()
        self.closed = False
