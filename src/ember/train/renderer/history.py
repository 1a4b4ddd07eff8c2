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
    epochs: tuple[tuple[int, int, int | None, int, int], ...]
    """(epoch, index of its first value, its number of iterations if known, iterations
    before its first value: > 0 when a run resumed mid-epoch, epochs it spans: > 1 where
    old neighbouring epochs were merged to keep the list bounded)."""
    count: int
    recent: tuple[float, ...]

    def _length(self, position: int) -> int:
        _, start, total, skipped, _ = self.epochs[position]
        if position + 1 < len(self.epochs):
            return self.epochs[position + 1][1] - start + skipped
        return total if total else self.count - start + skipped

    def x_of(self, index: float) -> float:
        """The position of raw value `index` in epochs: epoch e spans (e - 1, e]."""
        for position in range(len(self.epochs) - 1, -1, -1):
            epoch, start, _, skipped, span = self.epochs[position]
            if index >= start or position == 0:
                offset = index - start + skipped + 1
                return epoch - 1 + span * offset / max(self._length(position), 1)
        return 0.0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Bucket means as x (in epochs) and y arrays; buckets with no finite value are left out."""
        if not self.epochs or not self.counts:
            return np.zeros(0), np.zeros(0)
        sums = np.asarray(self.sums, dtype=np.float64)
        counts = np.asarray(self.counts, dtype=np.float64)
        raw = np.asarray(self.raw, dtype=np.float64)
        centres = np.arange(raw.size) * self.size + (raw - 1) / 2
        numbers = np.array([entry[0] for entry in self.epochs], dtype=np.float64)
        starts = np.array([entry[1] for entry in self.epochs], dtype=np.float64)
        skipped = np.array([entry[3] for entry in self.epochs], dtype=np.float64)
        spans = np.array([entry[4] for entry in self.epochs], dtype=np.float64)
        lengths = np.array([self._length(i) for i in range(len(self.epochs))], dtype=np.float64)
        segment = np.clip(np.searchsorted(starts, centres, side="right") - 1, 0, None)
        offset = centres - starts[segment] + skipped[segment] + 1
        x = numbers[segment] - 1 + spans[segment] * offset / np.maximum(lengths[segment], 1)
        keep = counts > 0
        return x[keep], sums[keep] / counts[keep]

    @property
    def last_x(self) -> float | None:
        return self.x_of(self.count - 1) if self.count else None


class History:
    """Iteration values in at most `capacity` buckets (bucket means, bucket size doubling as
    the run grows), at most `epochs` epoch boundaries (old neighbouring epochs merge
    into one span, as buckets do), and the last `recent` raw values. Appends are
    amortised O(1); memory and the cost of a view stay bounded however long the run, at
    100,000 epochs as at 100."""

    __slots__ = (
        "capacity",
        "count",
        "counts",
        "epoch_capacity",
        "epochs",
        "raw",
        "recent",
        "size",
        "sums",
    )

    def __init__(self, capacity: int = 512, recent: int = 300, epochs: int = 128) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {capacity!r}")
        self.capacity = capacity
        self.epoch_capacity = max(2, epochs)
        self.size = 1
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.raw: list[int] = []
        self.epochs: list[tuple[int, int, int | None, int, int]] = []
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
            if len(self.epochs) >= self.epoch_capacity:
                self._merge_epochs()
            start = (epoch, self.count, num_iterations, max(0, first_iteration - 1), 1)
            self.epochs.append(start)
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

    def _merge_epochs(self) -> None:
        """Merge neighbouring epochs pairwise (the first of each pair stays, spanning both)."""
        merged = []
        for i in range(0, len(self.epochs) - 1, 2):
            epoch, start, total, skipped, span = self.epochs[i]
            merged.append((epoch, start, total, skipped, span + self.epochs[i + 1][4]))
        if len(self.epochs) % 2:
            merged.append(self.epochs[-1])
        self.epochs = merged

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


class EpochValues:
    """The finished epoch values of one metric in one split, in bounded memory: the
    last `keep` to `2 * keep` exactly, older ones in at most `capacity` buckets of
    neighbouring epochs (count, mean, min and max; bucket width doubling as the run
    grows). A frame draws at most `capacity + 2 * keep` points however long the run."""

    __slots__ = ("buckets", "capacity", "keep", "latest", "recent", "width")

    def __init__(self, capacity: int = 64, keep: int = 64) -> None:
        self.capacity = max(2, capacity)
        self.keep = max(1, keep)
        self.recent: dict[int, float] = {}
        self.buckets: list[list[float]] = []
        """[first epoch, last epoch, count, sum of epochs, sum of values, min, max]."""
        self.width = 1
        self.latest: tuple[int, float] | None = None

    def __len__(self) -> int:
        return len(self.recent) + len(self.buckets)

    def add(self, epoch: int, value: float) -> None:
        self.recent[epoch] = value
        if self.latest is None or epoch >= self.latest[0]:
            self.latest = (epoch, value)
        while len(self.recent) > 2 * self.keep:
            for old in list(self.recent)[: self.keep]:
                self._bucket(old, self.recent.pop(old))

    def _bucket(self, epoch: int, value: float) -> None:
        last = self.buckets[-1] if self.buckets else None
        if last is None or last[2] >= self.width:
            if len(self.buckets) >= self.capacity:
                self.buckets = [_join(*pair) for pair in zip(self.buckets[::2], self.buckets[1::2])]
                self.width *= 2
            self.buckets.append([epoch, epoch, 0, 0.0, 0.0, math.inf, -math.inf])
            last = self.buckets[-1]
        last[1] = epoch
        last[2] += 1
        last[3] += epoch
        if _finite(value):
            last[4] += value
            last[5] = min(last[5], value)
            last[6] = max(last[6], value)
        else:
            last[2] -= 1

    def points(self) -> dict[int, float]:
        """At most `capacity + 2 * keep` (epoch, value) points, oldest first: each old
        bucket's mean at its middle epoch, then the recent epochs exactly."""
        out: dict[int, float] = {}
        for first, last, count, _, total, _, _ in self.buckets:
            if count:
                out[round((first + last) / 2)] = total / count
        out.update(self.recent)
        return out


def _join(a: list[float], b: list[float]) -> list[float]:
    return [a[0], b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], min(a[5], b[5]), max(a[6], b[6])]
