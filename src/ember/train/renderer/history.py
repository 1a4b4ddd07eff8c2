"""Bounded per-iteration history of one metric in one split, for the dashboard's charts."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

_finite = math.isfinite


@dataclass(frozen=True)
class HistoryView:
    """A copy of a `History` taken under the renderer's lock, read without it."""

    size: int
    sums: tuple[float, ...]
    counts: tuple[int, ...]
    raw: tuple[int, ...]
    epochs: tuple[tuple[int, int, int | None, int], ...]
    """(epoch, index of its first value, its number of iterations if known, iterations
    before its first value: > 0 when a run resumed mid-epoch)."""
    count: int
    recent: tuple[float, ...]

    def _length(self, position: int) -> int:
        _, start, total, skipped = self.epochs[position]
        if position + 1 < len(self.epochs):
            return self.epochs[position + 1][1] - start + skipped
        return total if total else self.count - start + skipped

    def x_of(self, index: float) -> float:
        """The position of raw value `index` in epochs: epoch e spans (e - 1, e]."""
        for position in range(len(self.epochs) - 1, -1, -1):
            epoch, start, _, skipped = self.epochs[position]
            if index >= start or position == 0:
                return epoch - 1 + (index - start + skipped + 1) / max(self._length(position), 1)
        return 0.0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Bucket means as x (in epochs) and y arrays; buckets with no finite value are left out."""
        if not self.epochs or not self.counts:
            return np.zeros(0), np.zeros(0)
        sums = np.asarray(self.sums, dtype=np.float64)
        counts = np.asarray(self.counts, dtype=np.float64)
        raw = np.asarray(self.raw, dtype=np.float64)
        centres = np.arange(raw.size) * self.size + (raw - 1) / 2
        numbers = np.array([epoch for epoch, _, _, _ in self.epochs], dtype=np.float64)
        starts = np.array([start for _, start, _, _ in self.epochs], dtype=np.float64)
        skipped = np.array([before for _, _, _, before in self.epochs], dtype=np.float64)
        lengths = np.array([self._length(i) for i in range(len(self.epochs))], dtype=np.float64)
        segment = np.clip(np.searchsorted(starts, centres, side="right") - 1, 0, None)
        offset = centres - starts[segment] + skipped[segment] + 1
        x = numbers[segment] - 1 + offset / np.maximum(lengths[segment], 1)
        keep = counts > 0
        return x[keep], sums[keep] / counts[keep]

    @property
    def last_x(self) -> float | None:
        return self.x_of(self.count - 1) if self.count else None


class History:
    """Iteration values in at most `capacity` buckets (bucket means, bucket size doubling as
    the run grows), the epoch boundaries, and the last `recent` raw values. Appends are
    amortised O(1); memory stays bounded however long the run."""

    __slots__ = ("capacity", "count", "counts", "epochs", "raw", "recent", "size", "sums")

    def __init__(self, capacity: int = 512, recent: int = 300) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {capacity!r}")
        self.capacity = capacity
        self.size = 1
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.raw: list[int] = []
        self.epochs: list[tuple[int, int, int | None, int]] = []
        self.count = 0
        self.recent: deque[float] = deque(maxlen=max(1, recent))

    def extend(
        self,
        epoch: int,
        num_iterations: int | None,
        values: Sequence[float],
        first_iteration: int = 1,
    ) -> None:
        """Append one tick's values of `epoch` (which has `num_iterations` if known);
        `first_iteration` is the iteration of the first value when it opens the epoch."""
        if not values:
            return
        if not self.epochs or self.epochs[-1][0] != epoch:
            self.epochs.append((epoch, self.count, num_iterations, max(0, first_iteration - 1)))
        self.recent.extend(values)
        index, total = 0, len(values)
        while index < total:
            if not self.raw or self.raw[-1] >= self.size:
                if len(self.raw) >= self.capacity:
                    self._halve()
                self.sums.append(0.0)
                self.counts.append(0)
                self.raw.append(0)
            room = self.size - self.raw[-1]
            chunk = values[index : index + room]
            good = [value for value in chunk if _finite(value)]
            if good:
                self.sums[-1] += sum(good)
                self.counts[-1] += len(good)
            self.raw[-1] += len(chunk)
            index += len(chunk)
        self.count += total

    def _halve(self) -> None:
        """Merge neighbouring buckets: half as many, each twice as wide."""

        def pairs(items: list) -> list:
            return [items[i] + items[i + 1] for i in range(0, len(items) - 1, 2)]

        self.sums, self.counts, self.raw = pairs(self.sums), pairs(self.counts), pairs(self.raw)
        self.size *= 2

    def view(self) -> HistoryView:
        """An immutable copy for drawing (O(capacity + recent), C-speed copies)."""
        return HistoryView(
            self.size,
            tuple(self.sums),
            tuple(self.counts),
            tuple(self.raw),
            tuple(self.epochs),
            self.count,
            tuple(self.recent),
        )


def finite_range(values: Iterable[float]) -> tuple[float, float] | None:
    """(min, max) of the finite values, or None."""
    low, high = math.inf, -math.inf
    for value in values:
        if _finite(value):
            if value < low:
                low = value
            if value > high:
                high = value
    return (low, high) if low <= high else None
