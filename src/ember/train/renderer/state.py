"""What a live renderer knows of a run: progress, metric histories, epoch values, timing.

`RunTracker` keeps it for the renderers that draw the whole run (the terminal
dashboard, the notebook display) and copies it into a `Snapshot` to draw from. It takes
no lock of its own: the dashboard calls it under its lock, the notebook display from
the training thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from ember.printable import printable
from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo, printable_info
from ember.train.renderer.format import format_number
from ember.train.renderer.history import EpochValues, History, HistoryView

SPLITS = ("train", "valid", "test")
"""The splits a renderer shows: training and validation, or an evaluation's (`test`)."""
METRIC_COLUMNS = (("train", "last"), ("train", "epoch"), ("valid", "epoch"))
"""The columns of a metrics table, as (split, kind of value) for `shown_value`: the
last training iteration's value, the training epoch's value, and the value of the
latest validation (an epoch's end, or a point inside an epoch with `valid_every`),
each headed by `column_label`."""
VALIDATIONS_KEPT = 512
"""The most validations a tracker keeps for the chart's markers (older ones thinned)."""
Mark = tuple[float, float, str]
"""A metric's value at one validation: (x in epochs, value, where: "epoch 2, iteration
400"); a point inside epoch e after k of its n training batches is at x = e - 1 + k / n,
the end of epoch e at x = e."""
MetricSeries = tuple[dict[str, HistoryView], dict[str, dict[int, float]], tuple[Mark, ...]]
"""One metric's iteration history and finished epoch values, per split, and its values
at the validations inside epochs (`valid_every`)."""


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
    validations: tuple[Mark, ...] = ()
    """The selected metric's value at each finished validation (points inside epochs
    and epoch ends)."""
    valid_at: tuple[int, int | None] | None = None
    """The latest finished validation: (epoch, training batches done before it, None
    for the epoch's end); None before the first."""
    valid_values: dict[str, float] = field(default_factory=dict)
    """Every validation metric's value at `valid_at`, by name."""
    finished: dict[str, int] = field(default_factory=dict)
    """The latest epoch each split finished."""


EVALUATION_COLUMNS = (("test", "last"), ("test", "epoch"))
"""The columns of an evaluation's metrics table: the last batch's value, and the value
over the batches so far (over the whole set once it ends)."""


def columns(snapshot: Snapshot) -> tuple[tuple[str, str], ...]:
    """The metrics table's columns: `METRIC_COLUMNS`, or an evaluation's."""
    return EVALUATION_COLUMNS if snapshot.info.evaluation is not None else METRIC_COLUMNS


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


def _running(snapshot: Snapshot, split: str) -> bool:
    """Whether `split` is under way (its epoch value is still a running one)."""
    progress = snapshot.progress
    return progress is not None and progress.split == split and snapshot.reason is None


def shown_value(snapshot: Snapshot, view: MetricView, kind: str) -> float | str | None:
    """The value a metrics table shows for `view`: its last iteration value (`kind`
    "last"), or its epoch value ("epoch"): the running one while its split is under
    way, else the latest finished one; for the validation, the latest finished
    validation's, a point inside an epoch included (`valid_at` says which)."""
    if kind == "last":
        return view.last
    value: float | str | None = snapshot.last_epoch_values.get((view.split, view.name))
    if view.split == "valid" and view.name in snapshot.valid_values:
        value = snapshot.valid_values[view.name]
    if value is None or _running(snapshot, view.split):
        value = view.epoch_value
    return value


def value_epoch(snapshot: Snapshot, split: str) -> tuple[int, int | None] | None:
    """Which epoch (and, for a validation inside an epoch, after how many training
    batches) the epoch values `shown_value` gives for `split` belong to."""
    progress = snapshot.progress
    if _running(snapshot, split):
        assert progress is not None
        return progress.epoch, None
    if split == "valid" and snapshot.valid_at is not None:
        return snapshot.valid_at
    if split in snapshot.finished:
        return snapshot.finished[split], None
    if progress is not None and progress.split == split:
        return progress.epoch, None
    return None


def where_text(at: tuple[int, int | None] | None, short: bool = False) -> str:
    """ "epoch 2", "epoch 2, iteration 400" ("ep 2 it 400" when `short`); "" for None."""
    if at is None:
        return ""
    epoch, iteration = at
    if iteration is None:
        return f"epoch {epoch}"
    return f"ep {epoch} it {iteration}" if short else f"epoch {epoch}, iteration {iteration}"


def column_label(snapshot: Snapshot, split: str, kind: str) -> str:
    """A metrics table column's heading: "train last", "train (epoch 3)", "valid (epoch
    2)", "valid (epoch 3, iteration 400)" (the chart's legend says the same)."""
    if kind == "last":
        return f"{split} last"
    if split == "test":
        return "test (whole set)" if "test" in snapshot.finished else "test (so far)"
    at = where_text(value_epoch(snapshot, split))
    return f"{split} ({at})" if at else f"{split} epoch"


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
        self.validations: list[tuple[int, int | None, float, dict[str, float]]] = []
        """Finished validations, points inside epochs (`valid_every`) and epoch ends, in
        order: (epoch, training batches before it or None at the epoch's end, x in
        epochs, {metric: value}); at most about `VALIDATIONS_KEPT`, older ones thinned."""
        self.finished: dict[str, int] = {}
        """The latest epoch each split finished."""
        self._train_length: tuple[int, int | None] = (0, None)
        """(epoch, its training batches) as the latest training progress told."""

    # The renderer calls -----------------------------------------------------------
    def start(self, info: RunInfo) -> None:
        """A new run: forget the previous one, note the registered metrics."""
        self._clear()
        self.info = info = printable_info(info)
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
        self.views = tuple(metrics)
        self._note(progress)
        if records:
            self._append(progress, records)

    def _note(self, progress: Progress) -> None:
        """Keep the training epoch's length (to place the validation points)."""
        if progress.split == "train":
            self._train_length = (progress.epoch, progress.num_iterations)

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """A split's epoch ended: its epoch values."""
        self.progress = progress
        self.views = tuple(metrics)
        self._note(progress)
        self.durations[progress.split] = progress.elapsed
        self.finished[progress.split] = progress.epoch
        if progress.split == "valid":
            self._validated(progress.epoch, None, float(progress.epoch), metrics)
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
        """A validation inside the epoch ended after `iteration` training batches: its
        values become the validation's latest, marked on the chart where it ran."""
        epoch, total = self._train_length
        if epoch == progress.epoch and total:
            x = epoch - 1 + min(iteration, total) / total
        else:  # a loader without a length: where the training curve has got to
            history = next((h for (s, _), h in self.histories.items() if s == "train"), None)
            last = history.view().last_x if history is not None else None
            x = last if last is not None else progress.epoch - 0.5
        self._validated(progress.epoch, iteration, x, metrics)

    def _validated(
        self, epoch: int, iteration: int | None, x: float, metrics: Sequence[MetricView]
    ) -> None:
        values = {
            view.name: float(view.epoch_value)
            for view in metrics
            if view.split == "valid" and isinstance(view.epoch_value, (int, float))
        }
        if not values:
            return
        self.validations.append((epoch, iteration, x, values))
        if len(self.validations) > 2 * VALIDATIONS_KEPT:  # every other one of the older half
            old = self.validations[:VALIDATIONS_KEPT]
            self.validations = old[::2] + self.validations[VALIDATIONS_KEPT:]

    @property
    def valid_at(self) -> tuple[int, int | None] | None:
        """The latest finished validation: (epoch, iteration or None at the epoch's end)."""
        return self.validations[-1][:2] if self.validations else None

    def end(self, reason: str) -> None:
        """The run ended (`reason`: completed, stopped: ..., failed, interrupted)."""
        self.reason = printable(reason)
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
        """One metric's iteration history and finished epoch values, per split, and its
        values at the validations inside epochs."""
        histories = {}
        epochs = {}
        for split in SPLITS:
            history = self.histories.get((split, name))
            if history is not None:
                histories[split] = history.view()
            values = self.epoch_values.get((split, name))
            if values:
                epochs[split] = values.points()
        return histories, epochs, self.marks(name, inside=True)

    def marks(self, name: str | None, inside: bool = False) -> tuple[Mark, ...]:
        """`name`'s value at each finished validation: the points inside epochs only
        when `inside`, else the epoch ends too."""
        return tuple(
            (x, values[name], where_text((epoch, iteration)))
            for epoch, iteration, x, values in self.validations
            if name in values and (iteration is not None or not inside)
        )

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
            return f"stopping: {printable(interrupter.message)}"
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
            histories, epochs, _ = self.series(selected)
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
            validations=self.marks(selected),
            valid_at=self.valid_at,
            valid_values=dict(self.validations[-1][3]) if self.validations else {},
            finished=dict(self.finished),
        )
