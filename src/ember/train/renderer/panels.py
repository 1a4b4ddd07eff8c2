"""The dashboard's panels, drawn from a `Snapshot` of the run (no locks, no threads here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.charts import Series, bar_chart, line_chart
from ember.train.renderer.format import format_duration, format_number
from ember.train.renderer.history import HistoryView

VIEWS = ("history", "recent", "epochs")
SPLIT_STYLES = {"train": "cyan", "valid": "magenta"}
BORDER = "grey42"
STATUS_WIDTH = 34
PROGRESS_HEIGHT = 4


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame shows, copied from the renderer under its lock."""

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
    elapsed: float = 0.0
    fraction: float | None = None
    eta: float | None = None
    recent: int = 300
    prompt: bool = False
    notice: str | None = None
    reason: str | None = None
    closing: bool = False


def dashboard(snapshot: Snapshot, width: int, height: int) -> RenderableType:
    """The whole dashboard, exactly `width` x `height` cells."""
    rows = _metric_rows(snapshot)
    top = min(max(len(rows) + 3, 8), max(8, height // 3))
    plot = max(6, height - 2 - top - PROGRESS_HEIGHT)
    grid = Table.grid(expand=True)
    grid.add_column(ratio=1)
    grid.add_column(width=STATUS_WIDTH)
    grid.add_row(metrics_panel(snapshot, rows, top), status_panel(snapshot, top))
    return Group(
        header(snapshot, width),
        grid,
        plot_panel(snapshot, width, plot),
        progress_panel(snapshot, width),
        footer(snapshot, width),
    )


def header(snapshot: Snapshot, width: int) -> Text:
    info = snapshot.info
    state = "training"
    if snapshot.reason is not None:
        state = snapshot.reason
    elif snapshot.notice:
        state = "stopping"
    text = Text(" ember ", style="bold black on cyan")
    text.append(
        f" {info.model_name} · {info.num_parameters:,} parameters · {', '.join(info.devices)}"
        f" · {info.artifact_dir}",
        style="bold",
    )
    right = f" {state} "
    room = width - text.cell_len - len(right)
    if room < 1:
        text.truncate(max(1, width - len(right) - 1), overflow="ellipsis")
        room = width - text.cell_len - len(right)
    text.append(" " * max(1, room))
    text.append(right, style="reverse" if snapshot.reason is None else "bold")
    text.truncate(width)
    return text


def _metric_rows(snapshot: Snapshot) -> list[tuple[str, str, dict[str, MetricView]]]:
    """(name, unit, {split: view}) in registration order."""
    order: dict[str, dict[str, MetricView]] = {}
    units: dict[str, str] = {}
    for view in snapshot.views:
        order.setdefault(view.name, {})[view.split] = view
        units.setdefault(view.name, view.unit)
    return [(name, units[name], splits) for name, splits in order.items()]


def metrics_panel(snapshot: Snapshot, rows: list, height: int) -> Panel:
    table = Table(box=None, expand=True, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("metric", no_wrap=True, ratio=2)
    for split in ("train", "valid"):
        style = SPLIT_STYLES[split]
        table.add_column(f"{split} last", justify="right", no_wrap=True, style=style, ratio=1)
        table.add_column(f"{split} epoch", justify="right", no_wrap=True, style=style, ratio=1)
    current = snapshot.progress.split if snapshot.progress else None
    for name, unit, splits in rows:
        cells = []
        for split in ("train", "valid"):
            view = splits.get(split)
            if view is None:
                cells += ["", ""]
                continue
            epoch = snapshot.last_epoch_values.get((split, name))
            if epoch is None or (split == current and snapshot.reason is None):
                epoch = view.epoch_value
            cells += [format_number(view.last, unit), format_number(epoch, unit)]
        selected = name == snapshot.selected
        label = Text(("▸ " if selected else "  ") + name, style="bold" if selected else "")
        table.add_row(label, *cells)
    if not rows:
        table.add_row(Text("no metric registered", style="grey50"), "", "", "", "")
    return Panel(table, title="metrics", title_align="left", border_style=BORDER, height=height)


def status_panel(snapshot: Snapshot, height: int) -> Panel:
    progress, info = snapshot.progress, snapshot.info
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="grey62", no_wrap=True)
    grid.add_column(no_wrap=True)
    if progress is None:
        grid.add_row("mode", "starting")
        grid.add_row("epoch", f"{info.start_epoch}/{info.num_epochs}")
    else:
        style = SPLIT_STYLES.get(progress.split, "")
        grid.add_row("mode", Text(progress.split, style=f"bold {style}"))
        grid.add_row("epoch", f"{progress.epoch}/{progress.num_epochs}")
        total = f"/{progress.num_iterations}" if progress.num_iterations else ""
        grid.add_row("iteration", f"{progress.iteration}{total}")
        grid.add_row("items", f"{progress.items:,}  ({progress.items_per_second:,.0f}/s)")
    grid.add_row("elapsed", format_duration(snapshot.elapsed))
    if snapshot.eta is not None and snapshot.reason is None:
        grid.add_row("eta", format_duration(snapshot.eta))
    return Panel(grid, title="status", title_align="left", border_style=BORDER, height=height)


def view_title(snapshot: Snapshot) -> str:
    if snapshot.view == "recent":
        return f"last {snapshot.recent} iterations"
    if snapshot.view == "epochs":
        return "per epoch"
    return "full history"


def plot_panel(snapshot: Snapshot, width: int, height: int) -> Panel:
    inner_w, inner_h = max(1, width - 4), max(1, height - 2)
    name = snapshot.selected
    if name is None:
        body: list[Text] = [
            Text("no numeric metric to plot (register one with metric_train_numeric)", style="grey50")
        ]
        title = "plot"
    else:
        unit = snapshot.units.get(name, "")
        title = f"{name}{f' ({unit})' if unit else ''} · {view_title(snapshot)}"
        legend = _legend(snapshot)
        chart_h = inner_h - 1
        if snapshot.view == "epochs":
            chart = _epochs_chart(snapshot, inner_w, chart_h)
        elif snapshot.view == "recent":
            chart = _recent_chart(snapshot, inner_w, chart_h)
        else:
            chart = _history_chart(snapshot, inner_w, chart_h)
        body = [legend, *chart]
    hint = "◀ ▶ metric · ▲ ▼ view"
    return Panel(
        Group(*body),
        title=f"[bold]{_escape(title)}[/]",
        title_align="left",
        subtitle=hint,
        subtitle_align="right",
        border_style=BORDER,
        height=height,
    )


def _escape(text: str) -> str:
    return text.replace("[", r"\[")


def _legend(snapshot: Snapshot) -> Text:
    text = Text(" ")
    unit = snapshot.units.get(snapshot.selected or "", "")
    for split in ("train", "valid"):
        history = snapshot.histories.get(split)
        if history is None and split not in snapshot.epoch_values:
            continue
        last = history.recent[-1] if history is not None and history.recent else None
        text.append("━━ ", style=SPLIT_STYLES[split])
        text.append(f"{split} {format_number(last, unit)}   ")
    return text


def _history_chart(snapshot: Snapshot, width: int, height: int) -> list[Text]:
    series, ends = [], []
    for split in ("train", "valid"):
        history = snapshot.histories.get(split)
        if history is None or not history.count:
            continue
        series.append(Series(history.points(), SPLIT_STYLES[split]))
        ends.append(history.last_x or 0.0)
    start = snapshot.info.start_epoch - 1
    end = max(ends) if ends else start + 1.0
    if end <= start:
        end = start + 1.0
    first, last = start + 1, math.ceil(end)
    every = max(1, math.ceil((last - first + 1) * 4 / max(1, width - 9)))
    ticks = [(e - 0.5, str(e)) for e in range(first, last + 1) if (e - first) % every == 0]
    return line_chart(series, width, height, (start, end), ticks, caption="epoch")


def _recent_chart(snapshot: Snapshot, width: int, height: int) -> list[Text]:
    windows = {
        split: history.recent
        for split, history in snapshot.histories.items()
        if history is not None and history.recent
    }
    longest = max((len(values) for values in windows.values()), default=0)
    series = []
    for split in ("train", "valid"):
        values = windows.get(split)
        if values:
            offset = longest - len(values)
            series.append(
                Series([(offset + i, v) for i, v in enumerate(values)], SPLIT_STYLES[split])
            )
    ticks = [(0.0, f"-{longest}"), (max(longest - 1, 1), "now")] if longest else []
    return line_chart(
        series, width, height, (0.0, float(max(longest - 1, 1))), ticks, caption="iterations"
    )


def _epochs_chart(snapshot: Snapshot, width: int, height: int) -> list[Text]:
    values = snapshot.epoch_values
    epochs = sorted({e for split in values.values() for e in split})
    progress = snapshot.progress
    running: dict[str, float] = {}
    if progress is not None and snapshot.reason is None:
        for view in snapshot.views:
            if view.name == snapshot.selected and view.split == progress.split:
                if isinstance(view.epoch_value, float) and progress.epoch not in values.get(
                    view.split, {}
                ):
                    running[view.split] = view.epoch_value
        if running and progress.epoch not in epochs:
            epochs.append(progress.epoch)
    splits = [s for s in ("train", "valid") if s in values or s in running or s in snapshot.histories]
    groups = []
    for epoch in epochs:
        bars: list[tuple[float | None, str]] = []
        for split in splits:
            value = values.get(split, {}).get(epoch)
            style = SPLIT_STYLES[split]
            if value is None and epoch == (progress.epoch if progress else None):
                value = running.get(split)
                style = f"dim {style}"
            bars.append((value, style))
        groups.append((str(epoch), bars))
    return bar_chart(groups, width, height, caption="epoch")


def _bar(fraction: float, width: int, style: str) -> Text:
    fraction = min(1.0, max(0.0, fraction))
    done = int(round(fraction * width))
    text = Text("━" * done, style=style)
    text.append("━" * (width - done), style="grey23")
    return text


def progress_panel(snapshot: Snapshot, width: int) -> Panel:
    progress = snapshot.progress
    inner = max(10, width - 4)
    bar_w = max(4, inner - 51)
    lines = []
    if progress is None:
        fraction, label = 0.0, "starting"
        style = "cyan"
    else:
        total = progress.num_iterations
        fraction = progress.iteration / total if total else 0.0
        label = f"{progress.split} {progress.iteration}{f'/{total}' if total else ''}"
        style = SPLIT_STYLES.get(progress.split, "cyan")
    rate = f"{progress.items_per_second:,.0f} items/s" if progress else ""
    line = Text("epoch ", style="grey62")
    line.append_text(_bar(fraction, bar_w, style))
    line.append(f" {100 * fraction:5.1f}%  {label:<16} {rate:>18}"[: inner - line.cell_len])
    lines.append(line)
    overall = snapshot.fraction or 0.0
    epoch = f"epoch {progress.epoch}/{progress.num_epochs}" if progress else ""
    eta = f"eta {format_duration(snapshot.eta)}" if snapshot.eta is not None else "eta -"
    if snapshot.reason is not None:
        eta = f"took {format_duration(snapshot.elapsed)}"
    line = Text("total ", style="grey62")
    line.append_text(_bar(overall, bar_w, "green"))
    line.append(f" {100 * overall:5.1f}%  {epoch:<16} {eta:>18}"[: inner - line.cell_len])
    lines.append(line)
    return Panel(
        Group(*lines), title="progress", title_align="left", border_style=BORDER, height=PROGRESS_HEIGHT
    )


def footer(snapshot: Snapshot, width: int) -> Text:
    if snapshot.closing:
        text = Text(f" training {snapshot.reason} · press any key to close ", style="bold reverse")
    elif snapshot.prompt:
        text = Text(" stop the run? ", style="bold reverse")
        text.append("  s", style="bold")
        text.append(" stop gracefully (finish the step, checkpoint, exit)  ")
        text.append("k", style="bold")
        text.append(" kill now  ")
        text.append("c", style="bold")
        text.append(" cancel")
    elif snapshot.notice:
        text = Text(f" {snapshot.notice} ", style="bold yellow")
    elif snapshot.reason is not None:
        text = Text(f" training {snapshot.reason}", style="bold")
    else:
        text = Text(" ◀ ▶", style="bold")
        text.append(" metric   ")
        text.append("▲ ▼", style="bold")
        text.append(" view   ")
        text.append("q", style="bold")
        text.append(" stop or kill")
    text.truncate(width)
    return text


def select_metric(names: Sequence[str], current: str | None, step: int) -> str | None:
    """The metric `step` places after `current` in `names`, wrapping around."""
    if not names:
        return None
    if current not in names:
        return names[0]
    return names[(names.index(current) + step) % len(names)]
