"""`ember plot DIR`: PNG charts of a finished (or running) run, read from its metric logs.

For every metric log name it writes `<Metric>-iterations.png` (every iteration across
epochs, train and valid, smoothed when long, and each validation's value marked at the
training iteration where it ran: the points inside epochs of `valid_every` and the
epochs' ends) and `<Metric>-epochs.png` (train and valid epoch values), and for each
matrix metric (a confusion matrix) `<Metric>-<split>-matrix.png`, a heat map of its
last epoch's counts. A directory where `lr_find` ran also gets `lr-find.png`: the loss
against the learning rate, the suggestion and the edge of stability marked, and each
step's ratio of realized to promised decrease below. Legends stand beside the plotting
area and every number in a label has 4 significant digits. Needs matplotlib (`pip
install ember[plot]`), imported only here.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ember.errors import EmberError
from ember.figures import legend_beside, markers_whole, save, significant
from ember.figures import matplotlib as _figures
from ember.lr_find_figure import lr_find_figure, lr_find_range, plot_lr_find
from ember.train.files.artifacts import SPLITS, Artifacts
from ember.train.files.metric_files import metric_stem, read_metric_log
from ember.train.summary import MatrixSummary, epoch_values, last_matrices, point_values

__all__ = ["MetricLogs", "lr_find_figure", "lr_find_range", "plot_lr_find", "plot_run", "read_run"]

COLOURS = {"train": "#1f77b4", "valid": "#ff7f0e"}
SMOOTH_ABOVE = 60
"""Curves with more points than this get a smoothed line over the faint raw one."""


@dataclass
class MetricLogs:
    """One metric's values per split: per epoch, its (value, weight) rows."""

    name: str
    splits: dict[str, dict[int, list[tuple[float, float]]]] = field(default_factory=dict)
    epoch_values: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """Per split, the run's exact epoch values (from its history)."""
    points: list[tuple[int, int, float]] = field(default_factory=list)
    """The validations inside epochs (`valid_every`): (epoch, training batches before
    it, value)."""

    def iterations(self, split: str) -> tuple[list[int], list[float], list[tuple[int, int]]]:
        """Global iteration numbers (1-based, counted across epochs), values, and each
        epoch that has values with its first global iteration."""
        xs: list[int] = []
        ys: list[float] = []
        starts: list[tuple[int, int]] = []
        for epoch, rows in sorted(self.splits.get(split, {}).items()):
            if rows:
                starts.append((epoch, len(xs) + 1))
            for value, _ in rows:
                xs.append(len(xs) + 1)
                ys.append(value)
        return xs, ys, starts

    def epochs(self, split: str) -> tuple[list[int], list[float]]:
        """Epoch numbers and epoch values (the run history's, as the summary shows them)."""
        pairs = self.epoch_values.get(split, [])
        return [e for e, _ in pairs], [v for _, v in pairs]


log = logging.getLogger(__name__)


def read_run(artifact_dir: str | os.PathLike[str]) -> list[MetricLogs]:
    """Every metric log of a run, grouped by metric name (the log file's stem)."""
    root = Path(artifact_dir)
    if not root.is_dir():
        raise EmberError(f"{root}: no such artifact directory.")
    metrics: dict[str, MetricLogs] = {}
    artifacts = Artifacts(root)
    for split in SPLITS:
        for epoch, stem, path in artifacts.metric_logs(split):
            logs = metrics.setdefault(stem, MetricLogs(stem))
            damage: list[str] = []
            logs.splits.setdefault(split, {})[epoch] = read_metric_log(path, damage)
            for problem in damage:  # drawn up to the damaged line, and said so
                log.warning("warning: %s", problem)
    for (split, stem), values in epoch_values(root).items():
        if stem in metrics:
            metrics[stem].epoch_values[split] = values
    for stem, points in point_values(root).items():
        if stem in metrics:
            metrics[stem].points = points
    found = [
        m for m in metrics.values() if any(rows for s in m.splits.values() for rows in s.values())
    ]
    if not found:
        raise EmberError(
            f"{root} holds no metric logs (expected train/epoch-N/<Metric>.log or "
            "valid/epoch-N/<Metric>.log): is it an ember artifact directory?"
        )
    return sorted(found, key=lambda m: m.name.lower())


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average over `window` points (shorter at the ends); NaNs skipped."""
    import numpy as np

    data = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(data)
    clean = np.where(finite, data, 0.0)
    sums = np.concatenate(([0.0], np.cumsum(clean)))
    counts = np.concatenate(([0], np.cumsum(finite)))
    half = max(1, window) // 2
    index = np.arange(data.size)
    low = np.clip(index - half, 0, data.size)
    high = np.clip(index + half + 1, 0, data.size)
    n = counts[high] - counts[low]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (sums[high] - sums[low]) / n
    return np.where(n > 0, out, np.nan).tolist()


def _matplotlib() -> Any:
    return _figures("ember plot")


def validations(
    metric: MetricLogs, lengths: dict[int, int]
) -> tuple[list[float], list[float], str]:
    """Each validation's value at the training iteration where it ran (counted across
    epochs, as the training curve): a point inside epoch e after k batches at the
    iteration before the epoch's first plus k, an epoch's end at its last iteration;
    epochs without training logs are left out. Also the latest one in words ("epoch 2,
    iteration 400: 0.1286")."""
    offsets: dict[int, int] = {}
    total = 0
    for epoch in sorted(lengths):
        offsets[epoch] = total
        total += lengths[epoch]
    found: list[tuple[int, int | None, float]] = list(metric.points)
    found += [(epoch, None, value) for epoch, value in metric.epoch_values.get("valid", [])]
    placed = []
    for epoch, iteration, value in found:
        if epoch in offsets:
            at = offsets[epoch] + (iteration if iteration is not None else lengths[epoch])
            where = f"epoch {epoch}" + (f", iteration {iteration}" if iteration else "")
            placed.append((at, value, where))
    placed.sort(key=lambda item: item[0])
    latest = f"{placed[-1][2]}: {significant(placed[-1][1])}" if placed else ""
    return [float(x) for x, _, _ in placed], [v for _, v, _ in placed], latest


def train_lengths(metrics: Sequence[MetricLogs]) -> dict[int, int]:
    """The training iterations of each epoch, as the training logs have them."""
    lengths: dict[int, int] = {}
    for metric in metrics:
        for epoch, rows in metric.splits.get("train", {}).items():
            lengths[epoch] = max(lengths.get(epoch, 0), len(rows))
    return lengths


def plot_iterations(metric: MetricLogs, path: Path, lengths: dict[int, int] | None = None) -> Path:
    """`iterations_figure` as a PNG at `path`."""
    return save(iterations_figure(metric, lengths), path)


def iterations_figure(metric: MetricLogs, lengths: dict[int, int] | None = None) -> Any:
    """Per-iteration curves, one panel per split, epoch boundaries marked (one line
    collection and a top axis, however many epochs). Each validation's value is marked
    on the training panel at the iteration where it ran (`lengths`: the training
    iterations of each epoch, by default this metric's); a metric without training
    values gets a panel of its own for them, on the training iteration axis."""
    Figure, _ = _matplotlib()
    lengths = lengths if lengths is not None else train_lengths([metric])
    xs_valid, ys_valid, latest = validations(metric, lengths)
    panels = [s for s in SPLITS if metric.splits.get(s)]
    if xs_valid and "train" not in panels:
        panels.insert(0, "validations")
    figure = Figure(figsize=(11, 3.2 * len(panels) + 0.8), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, split in zip(axes, panels):
        if split == "validations":
            count, starts = sum(lengths.values()), _starts(lengths)
        else:
            xs, ys, starts = metric.iterations(split)
            count = len(xs)
            _curve(ax, xs, ys, split)
        if split in ("train", "validations") and xs_valid:
            ax.plot(
                xs_valid,
                ys_valid,
                linestyle="none",
                marker="D",
                markersize=5,
                color=COLOURS["valid"],
                markeredgecolor="black",
                markeredgewidth=0.5,
                label=f"valid, where it ran (latest {latest})",
                zorder=3,
            )
            count = max(count, math.ceil(max(xs_valid)))
        _epoch_axis(ax, starts, count)
        ax.set_xlim(0.5, max(count, 1) + 0.5)
        ax.set_ylabel(metric.name)
        axis = "train" if split == "validations" else split
        ax.set_xlabel(f"{axis} iteration (counted across epochs)")
        ax.grid(True, alpha=0.3)
        legend_beside(ax)
    figure.suptitle(f"{metric.name} per iteration", fontsize=14, fontweight="bold")
    for ax in axes:  # the last validation's marker whole at the right edge
        markers_whole(ax)
    return figure


def _starts(lengths: dict[int, int]) -> list[tuple[int, int]]:
    """Each epoch with its first training iteration counted across epochs."""
    starts, first = [], 1
    for epoch in sorted(lengths):
        starts.append((epoch, first))
        first += lengths[epoch]
    return starts


def _curve(ax: Any, xs: list[int], ys: list[float], split: str) -> None:
    """A split's iteration values: a moving average over the faint raw ones when long."""
    colour = COLOURS[split]
    last = f": {significant(ys[-1])}" if ys else ""
    if len(xs) > SMOOTH_ABOVE:
        ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=0.8, label=f"{split} (raw, last{last})")
        window = max(5, len(xs) // 50)
        ax.plot(
            xs,
            smooth(ys, window),
            color=colour,
            linewidth=2.0,
            label=f"{split} (moving average of {window})",
        )
    else:
        ax.plot(
            xs,
            ys,
            color=colour,
            linewidth=1.5,
            marker="." if len(xs) < 30 else None,
            label=f"{split} (last{last})",
        )


EPOCH_MARKERS = 200
"""Epoch charts mark each epoch's value with a dot up to this many epochs."""
EPOCH_LABELS = 20
"""At most this many epochs are labelled on the top axis of an iteration chart."""
EPOCH_LINES = 50
"""Up to this many epochs, every epoch boundary is a dotted line across the chart;
beyond, only the labelled epochs' boundaries are (the others are ticks on the top axis)."""


def _epoch_axis(ax: Any, starts: list[tuple[int, int]], count: int) -> None:
    """Epoch boundaries on an iteration chart: a top axis with a tick at each epoch's
    start (labelled for at most `EPOCH_LABELS` epochs) and dotted lines drawn as one
    artist. The number of artists does not grow with the number of epochs."""
    if len(starts) < 2:
        return
    bounds = [first - 0.5 for _, first in starts]
    step = max(1, math.ceil(len(starts) / EPOCH_LABELS))
    labelled = list(range(0, len(starts), step))
    secondary = ax.secondary_xaxis("top")
    centres = [(a + b) / 2 for a, b in itertools.pairwise([*bounds, count + 0.5])]
    secondary.set_xticks([centres[i] for i in labelled], [str(starts[i][0]) for i in labelled])
    secondary.tick_params(labelsize=8, length=0)
    secondary.set_xlabel("epoch", fontsize=9)
    # Past EPOCH_LINES epochs, a line at every boundary would hide the curve: the
    # labelled epochs' boundaries only.
    every = len(starts) <= EPOCH_LINES
    lines = bounds[1:] if every else [bounds[i] for i in labelled if i > 0]
    ax.vlines(
        lines,
        0,
        1,
        transform=ax.get_xaxis_transform(),
        colors="grey",
        linewidth=0.8,
        linestyles=":",
        alpha=0.8,
    )


def plot_epochs(metric: MetricLogs, path: Path) -> Path:
    """`epochs_figure` as a PNG at `path`."""
    return save(epochs_figure(metric), path)


def epochs_figure(metric: MetricLogs) -> Any:
    """The run's exact epoch values (as `ember summary` shows them), train against valid."""
    Figure, _ = _matplotlib()
    figure = Figure(figsize=(9, 5), layout="constrained")
    ax = figure.subplots()
    all_epochs: list[int] = []
    for split in SPLITS:
        epochs, values = metric.epochs(split)
        if not epochs:
            continue
        all_epochs += epochs
        label = f"{split} (epoch {epochs[-1]}: {significant(values[-1])})"
        marker = "o" if len(epochs) <= EPOCH_MARKERS else None  # 10,000 markers take seconds
        ax.plot(epochs, values, color=COLOURS[split], marker=marker, linewidth=2.0, label=label)
    if all_epochs:
        first, last = min(all_epochs), max(all_epochs)
        step = max(1, math.ceil((last - first + 1) / 20))
        ax.set_xticks(range(first, last + 1, step))
        ax.set_xlim(first - 0.5, last + 0.5)
    ax.set_title(
        f"{metric.name} per epoch",
        fontsize=13,
        fontweight="bold",
    )
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.name)
    ax.grid(True, alpha=0.3)
    if all_epochs:
        legend_beside(ax, fontsize=10)
        markers_whole(ax)  # the last epoch's marker whole, however many epochs
    return figure


def plot_matrix(matrix: MatrixSummary, path: Path) -> Path:
    """`matrix_figure` as a PNG at `path`."""
    return save(matrix_figure(matrix), path)


def matrix_figure(matrix: MatrixSummary) -> Any:
    """A count matrix (a confusion matrix) as a heat map: target classes down,
    predicted classes across, each cell labelled with its count."""
    Figure, _ = _matplotlib()
    counts = matrix.counts
    size = len(counts)
    side = min(12.0, 3.0 + 0.6 * size)
    figure = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(counts, cmap="Blues", vmin=0)
    figure.colorbar(image, ax=ax, label="samples")
    high = max((max(row) for row in counts), default=0)
    if size <= 30:  # labels stay legible
        for row, values in enumerate(counts):
            for column, cell in enumerate(values):
                colour = "white" if high and cell > high / 2 else "black"
                ax.text(column, row, str(cell), ha="center", va="center", color=colour, fontsize=9)
    step = max(1, math.ceil(size / 30))
    ax.set_xticks(range(0, size, step))
    ax.set_yticks(range(0, size, step))
    ax.set_xlabel("predicted class")
    ax.set_ylabel("target class")
    ax.set_title(
        f"{matrix.name} ({matrix.split}, epoch {matrix.epoch})", fontsize=13, fontweight="bold"
    )
    return figure


def plot_run(
    artifact_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write the PNG charts of every metric of a run; return their paths. The default
    output directory is `ARTIFACT_DIR/plots`."""
    artifacts = Artifacts(artifact_dir)
    has_lr_find = artifacts.lr_find.is_file()
    try:
        metrics = read_run(artifact_dir)
    except EmberError:
        if not has_lr_find:
            raise
        metrics = []  # only a learning-rate range test so far
    _matplotlib()
    target = Path(output_dir) if output_dir is not None else Path(artifact_dir) / "plots"
    if output_dir is None:  # inside the run: never through a link out of it
        artifacts.check_links(EmberError)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EmberError(f"Cannot create the output directory {target}: {error}.") from None
    written = []
    lengths = train_lengths(metrics)
    for metric in metrics:
        path = target / f"{metric.name}-iterations.png"
        written.append(plot_iterations(metric, path, lengths))
        written.append(plot_epochs(metric, target / f"{metric.name}-epochs.png"))
    for matrix in last_matrices(artifact_dir):
        path = target / f"{metric_stem(matrix.name)}-{matrix.split}-matrix.png"
        written.append(plot_matrix(matrix, path))
    if has_lr_find:
        written.append(plot_lr_find(artifacts.lr_find, target / "lr-find.png"))
    return written
