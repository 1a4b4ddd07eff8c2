"""The dashboard, drawn from a `Snapshot` of the run (no locks, no threads here): the
layout of its panels for a terminal's size, the header, the status, the progress bars
and the footer.

Panels are composed as plain (text, style) runs of known width rather than rich
layouts: a whole frame costs about a millisecond, so drawing it ten times a second
takes little from the training thread.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len

from ember.train.renderer.boxes import LABEL, SPLIT_STYLES, beside, box, fit
from ember.train.renderer.charts import Line
from ember.train.renderer.format import format_duration
from ember.train.renderer.metrics_table import metrics_panel, metrics_window
from ember.train.renderer.plot_panel import plot_panel
from ember.train.renderer.state import Snapshot, metric_rows

VIEWS = ("history", "recent", "epochs")
"""The chart views, in the order up/down cycles through them."""
STATUS_WIDTH = 34
PROGRESS_HEIGHT = 4
FULL_HEIGHT = 16
"""The fewest lines that hold every panel, the chart included."""
PLOT_MIN = 8
"""The chart's lines (a legend and four rows of plot) the metrics table leaves it."""


def dashboard(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    """The whole dashboard: exactly `height` lines of `width` cells. Below `FULL_HEIGHT`
    lines the chart goes first, then the metrics: the header, the progress and the
    footer (which holds the stop prompt) stay on screen down to 3 lines."""
    rows = metric_rows(snapshot)
    status_w = min(STATUS_WIDTH, max(20, width // 3))
    if height < FULL_HEIGHT:
        return _compact(snapshot, rows, width, height, status_w)
    top = metrics_height(len(rows), height)
    plot = max(5, height - 2 - top - PROGRESS_HEIGHT)
    lines = [header(snapshot, width)]
    lines += beside(
        metrics_panel(snapshot, rows, width - status_w, top), status_panel(snapshot, status_w, top)
    )
    lines += plot_panel(snapshot, width, plot)
    lines += progress_panel(snapshot, width)
    lines.append(footer(snapshot, width))
    return [fit(line, width) for line in lines[:height]]


def metrics_height(count: int, height: int) -> int:
    """The lines of the metrics panel in a frame of `height` lines (box and header
    included) for `count` metrics: all of them if the chart keeps `PLOT_MIN` lines
    (or half the room on a tall terminal), else as many as that leaves room for. On a
    short terminal (below `FULL_HEIGHT`) the chart goes and the metrics take its room."""
    if height < FULL_HEIGHT:
        room = max(1, height - 2)
        return room - PROGRESS_HEIGHT if room >= PROGRESS_HEIGHT + 4 else 0
    room = height - 2 - PROGRESS_HEIGHT
    most = max(4, height // 3, room - max(PLOT_MIN, room // 2))
    return min(max(count + 3, 8), most)


def metrics_scroll(snapshot: Snapshot, height: int) -> tuple[int, int, int]:
    """Where a frame of `height` lines has the metrics table: (first row shown, rows
    shown, rows in all)."""
    count = len(metric_rows(snapshot))
    shown = max(0, min(count, metrics_height(count, height) - 3))
    return metrics_window(snapshot, count, shown), shown, count


def _compact(snapshot: Snapshot, rows: list, width: int, height: int, status_w: int) -> list[Line]:
    """A short terminal: no chart; the metrics if there is room, the progress bars
    (framed if there is room), and always the header and the footer."""
    room = max(1, height - 2)
    progress = progress_panel(snapshot, width)
    body: list[Line] = []
    if room >= PROGRESS_HEIGHT + 4:
        top = room - PROGRESS_HEIGHT
        body += beside(
            metrics_panel(snapshot, rows, width - status_w, top),
            status_panel(snapshot, status_w, top),
        )
        body += progress
    elif room >= PROGRESS_HEIGHT:
        body += progress
    else:
        body += progress[1:-1][:room]  # the bars, without their frame
    body += [[] for _ in range(room - len(body))]
    lines = [header(snapshot, width), *body[:room], footer(snapshot, width)]
    return [fit(line, width) for line in lines[:height]]


def header(snapshot: Snapshot, width: int) -> Line:
    info = snapshot.info
    state = snapshot.reason if snapshot.reason is not None else info.activity
    if snapshot.reason is None and snapshot.notice:
        state = "stopping"
    right = f" {state} "
    about = (
        f" {info.model_name} · {info.num_parameters:,} parameters · {', '.join(info.devices)}"
        f" · {info.artifact_dir}"
    )
    room = max(0, width - 7 - len(right) - 1)
    left = fit([(about, "bold")], room) if cell_len(about) > room else [(about, "bold")]
    line: Line = [(" ember ", "bold black on cyan"), *left]
    used = 7 + sum(cell_len(text) for text, _ in left)
    line.append((" " * max(1, width - used - len(right)), ""))
    line.append((right, "reverse" if snapshot.reason is None else "bold"))
    return line


def status_panel(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    progress, info = snapshot.progress, snapshot.info
    rows: list[tuple[str, str, str]] = []
    if progress is None:
        rows.append(("mode", "starting", ""))
        rows.append(("epoch", f"{info.start_epoch}/{info.num_epochs}", ""))
    else:
        style = f"bold {SPLIT_STYLES.get(progress.split, '')}"
        if info.evaluation is not None:  # one pass over a data set: no epochs
            rows.append(("mode", "evaluating", style))
        else:
            rows.append(("mode", progress.split, style))
            rows.append(("epoch", f"{progress.epoch}/{progress.num_epochs}", ""))
        total = f"/{progress.num_iterations}" if progress.num_iterations else ""
        rows.append(("iteration", f"{progress.iteration}{total}", ""))
        rows.append(("items", f"{progress.items:,}", ""))
        if progress.tokens is not None:
            rows.append(("tokens", f"{progress.tokens:,}", ""))
        if progress.run:
            unit, _, done = progress.run.partition(" ")
            rows.append((unit, done, ""))
    rows.append(("elapsed", format_duration(snapshot.elapsed), ""))
    if snapshot.eta is not None and snapshot.reason is None:
        rows.append(("eta", format_duration(snapshot.eta), ""))
    body = [[(f"{label:<10}", LABEL), (value, style)] for label, value, style in rows]
    return box([("status", "bold")], body, width, height)


def _bar(fraction: float, width: int, style: str) -> Line:
    done = round(min(1.0, max(0.0, fraction)) * width)
    return [("━" * done, style), ("━" * (width - done), "grey23")]


def progress_panel(snapshot: Snapshot, width: int) -> list[Line]:
    progress = snapshot.progress
    bar_w = max(4, width - 4 - 57)
    if progress is None:
        fraction, label, style, rate = 0.0, "starting", "cyan", "loading the first batch"
    else:
        total = progress.num_iterations
        fraction = progress.iteration / total if total else 0.0
        label = f"{progress.split} {progress.iteration}{f'/{total}' if total else ''}"
        style = SPLIT_STYLES.get(progress.split, "cyan")
        rate = speed_text(progress.split, progress.items_per_second)
    epoch_line: Line = [("epoch ", LABEL), *_bar(fraction, bar_w, style)]
    epoch_line.append((f" {100 * fraction:5.1f}%  {label:<16} {rate:>24}", ""))
    overall = snapshot.fraction or 0.0
    epoch = f"epoch {progress.epoch}/{progress.num_epochs}" if progress else ""
    if snapshot.info.evaluation is not None:
        epoch = repr(snapshot.info.evaluation)
    if snapshot.reason is not None:
        eta = f"took {format_duration(snapshot.elapsed)}"
    else:
        eta = f"eta {format_duration(snapshot.eta)}" if snapshot.eta is not None else "eta -"
    total_line: Line = [("total ", LABEL), *_bar(overall, bar_w, "green")]
    total_line.append((f" {100 * overall:5.1f}%  {epoch:<16} {eta:>24}", ""))
    return box([("progress", "bold")], [epoch_line, total_line], width, PROGRESS_HEIGHT)


def speed_text(split: str, items_per_second: float) -> str:
    """A split's speed, named: "train 1,234 items/s"."""
    return f"{split} {items_per_second:,.0f} items/s"


def footer(snapshot: Snapshot, width: int) -> Line:
    if snapshot.closing:
        ended = f" {snapshot.info.noun} {snapshot.reason} · press any key to close "
        return [(ended, "bold reverse")]
    if snapshot.prompt:
        return [
            (" stop the run? ", "bold reverse"),
            ("  s", "bold"),
            (" stop gracefully (finish the step, checkpoint, exit)   ", ""),
            ("k", "bold"),
            (" kill now   ", ""),
            ("c", "bold"),
            (" cancel", ""),
        ]
    if snapshot.reason is not None:
        return [(f" {snapshot.info.noun} {snapshot.reason}", "bold")]
    if snapshot.notice:
        return [(f" {snapshot.notice} ", "bold yellow")]
    return [
        (" ◀ ▶", "bold"),
        (" metric   ", ""),
        ("▲ ▼", "bold"),
        (" view   ", ""),
        ("q", "bold"),
        (" stop or kill", ""),
    ]


def select_metric(names: Sequence[str], current: str | None, step: int) -> str | None:
    """The metric `step` places after `current` in `names`, wrapping around."""
    if not names:
        return None
    if current not in names:
        return names[0]
    return names[(names.index(current) + step) % len(names)]
