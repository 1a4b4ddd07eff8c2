"""Drive a metric logger as the learner does, and what it should then hold."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ember.train.logger import MetricRecord

METRICS = ("Loss", "Accuracy (top-1)")
# Iterations per split and epoch, and how the processor's ticks split them into log() calls.
CALLS = {"train": [[1, 2, 3], [4, 5]], "valid": [[1, 2, 3]]}
EPOCHS = (1, 2)


@dataclass
class Expected:
    """What a driven logger received: iteration rows and epoch aggregates."""

    # (split, epoch, iteration, name, value, weight, global step)
    iterations: list[tuple[str, int, int, str, float, float, int]] = field(default_factory=list)
    # (split, epoch, name, aggregate)
    epochs: list[tuple[str, int, str, float]] = field(default_factory=list)

    def series(self, split: str, name: str) -> list[tuple[int, float]]:
        """(global step, value) of one metric's iterations."""
        return [(s, v) for sp, _, _, n, v, _, s in self.iterations if (sp, n) == (split, name)]

    def epoch_series(self, split: str, name: str) -> list[tuple[int, float]]:
        """(epoch, aggregate) of one metric."""
        return [(e, v) for sp, e, n, v in self.epochs if (sp, n) == (split, name)]


def value_of(split: str, epoch: int, iteration: int, name: str) -> float:
    """A value with a long decimal expansion, so float32 rounding and text formats show."""
    base = 1.0 / (iteration + 2) + 0.1 * epoch
    if name == "Loss":
        return base + (0.5 if split == "valid" else 0.0)
    return 100.0 / 3.0 + iteration * math.pi


def weight_of(split: str, iteration: int) -> float:
    last = CALLS[split][-1][-1]
    return 8.0 if iteration == last else 32.0


def drive(logger) -> Expected:
    """Two epochs of train then valid, several log() calls each, end_epoch per split,
    then close() twice (the learner closes a logger once per split it is registered for)."""
    expected = Expected()
    steps = {"train": 0, "valid": 0}
    for epoch in EPOCHS:
        for split in ("train", "valid"):
            rows: dict[str, list[tuple[float, float]]] = {name: [] for name in METRICS}
            for call in CALLS[split]:
                records = []
                for name in METRICS:  # the processor sends records grouped by metric
                    for iteration in call:
                        value, weight = (
                            value_of(split, epoch, iteration, name),
                            weight_of(split, iteration),
                        )
                        records.append(MetricRecord(name, iteration, value, weight))
                        rows[name].append((value, weight))
                        expected.iterations.append(
                            (split, epoch, iteration, name, value, weight, steps[split] + iteration)
                        )
                logger.log(split, epoch, records)
            steps[split] += CALLS[split][-1][-1]
            aggregates = {
                name: math.fsum(v * w for v, w in pairs) / math.fsum(w for _, w in pairs)
                for name, pairs in rows.items()
            }
            logger.end_epoch(split, epoch, aggregates)
            expected.epochs.extend((split, epoch, name, v) for name, v in aggregates.items())
    logger.close()
    logger.close()
    return expected
