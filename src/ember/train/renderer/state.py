"""What a live renderer knows of a run: progress, metric histories, epoch values, timing.

`RunTracker` keeps it for the renderers that draw the whole run (the terminal
dashboard, the notebook display) and copies it into a `Snapshot` to draw from. It takes
no lock of its own: the dashboard calls it under its lock, the notebook display from
the training thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.format import format_number
from ember.train.renderer.history import EpochValues, History, HistoryView

SPLITS = ("train", "valid")
METRIC_COLUMNS = (("train", "last"), ("train", "epoch"), ("valid", "last"), ("valid", "epoch"))
"""The columns of a metrics table, as (split, kind of value) for `shown_value`."""
MetricSeries = tuple[dict[str, HistoryView], dict[str, dict[int, float]]]
"""One metric's iteration history and finished epoch values, per split."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame shows, copied from the renderer's state (under its lock)."""

    info: RunInfo
    progress: Progress | None
    views: tuple[MetricView, ...]
    names: tuple[str, ...]
    """The numeric metrics that can be plotted, in registration order."""
    selected: str | None
    view: str
    units: dict[str, str] = field(default_factory=dict)
    histories: dict[str, HistoryView] = field(default_factory=dict)
    """The selected metric's history per split."""
    epoch_values: dict[str, dict[int, float]] = field(default_factory=dict)
    """The selected metric's finished epoch values per split."""
    last_epoch_values: dict[tuple[str, str], float] = field(default_factory=dict)
    """Every metric's latest finished epoch value, by (split, name)."""
    matrices: dict[str, tuple[int, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)
    """The selected metric's latest finished count matrix per split, with its epoch
    (matrix metrics such as the confusion matrix)."""
    elapsed: float = 0.0
    fraction: float | None = None
    eta: float | None = None
    recent: int = 300
    prompt: bool = False
    notice: str | None = None
    reason: str | None = None
    closing: bool = False
    scroll: int = 0
    """The first row of the metrics table asked for (the table shows what fits from there)."""
    follow: bool = False
    """Whether the metrics table scrolls to show the `selected` metric."""


def metric_rows(snapshot: Snapshot) -> list[tuple[str, str, dict[str, MetricView]]]:
    """The rows of a metrics table: (name, unit, {split: view}) in registration order."""
    order: dict[str, dict[str, MetricView]] = {}
    units: dict[str, str] = {}
    for view in snapshot.views:
        order.setdefault(view.name, {})[view.split] = view
        units.setdefault(view.name, view.unit)
    if not order:
        for _, name, unit, _ in snapshot.info.metrics:
            order.setdefault(name, {})
            units.setdefault(name, unit)
    return [(name, units[name], splits) for name, splits in order.items()]


def cell_text(snapshot: Snapshot, view: MetricView | None, kind: str, unit: str) -> str:
    """A metrics table cell: `shown_value` formatted, "" where the split lacks the metric."""
    return format_number(shown_value(snapshot, view, kind), unit) if view is not None else ""


def shown_value(snapshot: Snapshot, view: MetricView, kind: str) -> float | str | None:
    """The value a metrics table shows for `view`: its last iteration value (`kind`
    "last"), or its epoch value ("epoch"): the running one while its split is under
    way, else the latest finished one."""
    if kind == "last":
        return view.last
    value: float | str | None = snapshot.last_epoch_values.get((view.split, view.name))
    current = snapshot.progress.split if snapshot.progress else None
    if value is None or (view.split == current and snapshot.reason is None):
        value = view.epoch_value
    return value


class RunTracker:
    """The state of one run as the renderer calls report it: the latest progress and
    metric views, each numeric metric's bounded iteration `History` per split, the
    finished epoch values (bounded `EpochValues`: a frame costs the same at 100,000
    epochs as at 100), how long each split took, and how the run ended.

    `start` begins a new run (one tracker may follow several `fit` calls in turn)."""

    def __init__(self, recent: int = 300) -> None:
        self.recent = int(recent)
        """Raw values each history keeps for a "recent iterations" view."""
        self._clear()

    def _clear(self) -> None:
        self.info: RunInfo | None = None
        self.progress: Progress | None = None
        self.views: tuple[MetricView, ...] = ()
        self.histories: dict[tuple[str, str], History] = {}
        self.epoch_values: dict[tuple[str, str], EpochValues] = {}
        self.matrices: dict[tuple[str, str], tuple[int, tuple[tuple[int, ...], ...]]] = {}
        """The latest finished count matrix of each matrix metric, by (split, name)."""
        self.names: list[str] = []
        self._text: set[str] = set()
        """Metrics registered as text only (shown, never plotted)."""
        """The numeric metrics, in registration order (then in order of first value)."""
        self.units: dict[str, str] = {}
        self.durations: dict[str, float] = {}
        """How long each split's latest epoch took, in seconds."""
        self.reason: str | None = None
        """How the run ended (the `reason` given to `end`); None while it runs."""
        self.started_at = 0.0
        self.ended_at: float | None = None
        self.points: list[tuple[int, int, dict[str, float]]] = []
        """Validations inside epochs (`valid_every`): (epoch, iteration, {metric: value})."""
        self._point: dict[str, float] = {}
        """The latest point's values, shown as the validation's last values until the
        end-of-epoch validation ends."""

    # The renderer calls -----------------------------------------------------------
    def start(self, info: RunInfo) -> None:
        """A new run: forget the previous one, note the registered metrics."""
        self._clear()
        self.info = info
        self.started_at = time.monotonic()
        for _, name, unit, numeric in info.metrics:
            self.units.setdefault(name, unit)
            if numeric and name not in self.names:
                self.names.append(name)
        numeric_names = {name for _, name, _, numeric in info.metrics if numeric}
        self._text = {name for _, name, _, _ in info.metrics} - numeric_names

    def update(
        self, progress: Progress, metrics: Sequence[MetricView], records: Sequence[MetricRecord]
    ) -> None:
        """A tick: the progress, every metric's view, the new iteration values."""
        self.progress = progress
        self.views = self._with_point(metrics)
        if records:
            self._append(progress, records)

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """A split's epoch ended: its epoch values."""
        self.progress = progress
        self.views = tuple(metrics)
        self.durations[progress.split] = progress.elapsed
        if progress.split == "valid":
            self._point = {}
        for view in metrics:
            if view.split == progress.split and isinstance(view.epoch_value, (int, float)):
                key = (view.split, view.name)
                values = self.epoch_values.get(key)
                if values is None:
                    values = self.epoch_values[key] = EpochValues()
                values.add(progress.epoch, float(view.epoch_value))
            if view.split == progress.split and view.matrix is not None:
                self.matrices[(view.split, view.name)] = (progress.epoch, view.matrix)

    def valid_point(
        self, iteration: int, progress: Progress, metrics: Sequence[MetricView]
    ) -> None:
        """A validation inside the epoch ended after `iteration` training batches."""
        values = {
            view.name: float(view.epoch_value)
            for view in metrics
            if view.split == "valid" and isinstance(view.epoch_value, (int, float))
        }
        self.points.append((progress.epoch, iteration, values))
        self._point = values
        self.views = self._with_point(self.views)

    def _with_point(self, metrics: Sequence[MetricView]) -> tuple[MetricView, ...]:
        if not self._point:
            return tuple(metrics)
        return tuple(
            replace(view, last=self._point[view.name])
            if view.split == "valid" and view.name in self._point
            else view
            for view in metrics
        )

    def end(self, reason: str) -> None:
        """The run ended (`reason`: completed, stopped: ..., failed, interrupted)."""
        self.reason = reason
        self.ended_at = time.monotonic()

    # Reading ----------------------------------------------------------------------
    def history(self, split: str, name: str) -> History:
        """The iteration history of `name` in `split` (created empty on first use)."""
        history = self.histories.get((split, name))
        if history is None:
            history = self.histories[(split, name)] = History(recent=self.recent)
            if name not in self.names and name not in self._text:
                self.names.append(name)  # plotted: numeric, or not registered as text
        return history

    def _append(self, progress: Progress, records: Sequence[MetricRecord]) -> None:
        """New iteration values, grouped into runs of one metric (the processor's order)."""
        split, epoch, total = progress.split, progress.epoch, progress.num_iterations
        start, count = 0, len(records)
        while start < count:
            name = records[start].name
            end = start + 1
            while end < count and records[end].name == name:
                end += 1
            values = [r.value for r in records[start:end]]
            self.history(split, name).extend(epoch, total, values, records[start].iteration)
            start = end

    def series(self, name: str) -> MetricSeries:
        """One metric's iteration history and finished epoch values, per split."""
        histories = {}
        epochs = {}
        for split in SPLITS:
            history = self.histories.get((split, name))
            if history is not None:
                histories[split] = history.view()
            values = self.epoch_values.get((split, name))
            if values:
                epochs[split] = values.points()
        return histories, epochs

    def elapsed(self) -> float:
        """Seconds since `start`, until `end` once the run ended."""
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    def fraction(self) -> float | None:
        """The share of the run done: epochs done plus the current one, whose train and
        valid parts are weighed by how long each took in the previous epoch."""
        info, progress = self.info, self.progress
        if info is None or progress is None:
            return None
        epochs = info.num_epochs - info.start_epoch + 1
        if epochs <= 0:
            return None
        within = progress.iteration / progress.num_iterations if progress.num_iterations else 0.0
        train = self.durations.get("train")
        valid = self.durations.get("valid")
        if progress.split == "train":
            share = train / (train + valid) if train and valid else 1.0
            done = share * within
        else:
            if not train:
                share = 0.5
            elif valid:
                share = train / (train + valid)
            else:
                estimate = progress.elapsed / within if within > 0 else train
                share = train / (train + estimate)
            done = share + (1 - share) * within
        value = (progress.epoch - info.start_epoch + min(1.0, done)) / epochs
        if self.reason == "completed":
            value = 1.0
        return min(1.0, max(0.0, value))

    def interrupted(self) -> str | None:
        """The notice "stopping: <why>" while a graceful stop is pending, else None."""
        interrupter = self.info.interrupter if self.info is not None else None
        if interrupter is not None and interrupter.should_stop():
            return f"stopping: {interrupter.message}"
        return None

    def snapshot(
        self,
        selected: str | None = None,
        view: str = "history",
        *,
        prompt: bool = False,
        notice: str | None = None,
        closing: bool = False,
        scroll: int = 0,
        follow: bool = False,
    ) -> Snapshot:
        """A copy of the state to draw from, charting `selected` (the dashboard's choice
        of metric and `view`, and where its metrics table is scrolled to); `notice`
        defaults to a pending stop's message."""
        assert self.info is not None, "snapshot() before start()"
        if selected is not None:
            histories, epochs = self.series(selected)
        else:
            histories, epochs = {}, {}
        last = {key: v.latest[1] for key, v in self.epoch_values.items() if v.latest is not None}
        elapsed = self.elapsed()
        fraction = self.fraction()
        eta = None
        if fraction and self.reason is None and fraction > 0.002:
            eta = elapsed * (1 - fraction) / fraction
        return Snapshot(
            info=self.info,
            progress=self.progress,
            views=self.views,
            names=tuple(self.names),
            selected=selected,
            view=view,
            units=dict(self.units),
            histories=histories,
            epoch_values=epochs,
            last_epoch_values=last,
            matrices={
                split: found for (split, name), found in self.matrices.items() if name == selected
            },
            elapsed=elapsed,
            fraction=fraction,
            eta=eta,
            recent=self.recent,
            prompt=prompt,
            notice=notice or self.interrupted(),
            reason=self.reason,
            closing=closing,
            scroll=scroll,
            follow=follow,
        )
