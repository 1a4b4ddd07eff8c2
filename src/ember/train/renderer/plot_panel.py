"""The dashboard's chart panel: the selected metric over the full history, the last
iterations or per epoch, with a legend of its last values; a matrix metric's latest
counts as tables instead."""

from __future__ import annotations

import math

from rich.cells import cell_len

from ember.train.renderer.boxes import SPLIT_STYLES, beside, box, fit
from ember.train.renderer.charts import Line, Series, bar_chart, blank, line_chart
from ember.train.renderer.format import format_number
from ember.train.renderer.state import SPLITS, Snapshot, column_label, shown_value

MARKER = "●"
"""How a validation's value is marked on the full-history chart."""


def view_title(snapshot: Snapshot) -> str:
    """How the chart shows the metric: "full history", "last N iterations", "per epoch"."""
    if snapshot.view == "recent":
        return f"last {snapshot.recent} iterations"
    if snapshot.view == "epochs":
        return "per epoch"
    return "full history"


def plot_panel(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    inner_w, inner_h = max(1, width - 4), max(1, height - 2)
    name = snapshot.selected
    if name is None:
        title: Line = [("plot", "bold")]
        body = blank(inner_w, inner_h, "no numeric metric to plot (metric_train_numeric)")
    else:
        unit = snapshot.units.get(name, "")
        title = [
            (f"{name}{f' ({unit})' if unit else ''}", "bold"),
            (f" · {view_title(snapshot)}", ""),
        ]
        chart_h = inner_h - 1
        if snapshot.matrices:  # a matrix metric: its latest counts, as a table
            title[-1] = (" · counts of the last epoch", "")
            body = matrix_tables(snapshot, inner_w, inner_h)
            return box(title, body, width, height, subtitle="◀ ▶ metric")
        if snapshot.view == "epochs":
            chart = _epochs_chart(snapshot, inner_w, chart_h)
        elif snapshot.view == "recent":
            chart = _recent_chart(snapshot, inner_w, chart_h)
        else:
            chart = _history_chart(snapshot, inner_w, chart_h)
        body = [_legend(snapshot), *chart]
    return box(title, body, width, height, subtitle="◀ ▶ metric · ▲ ▼ view")


def matrix_tables(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    """The selected matrix metric's latest count matrix per split (rows: target classes,
    columns: predicted classes), side by side when they fit, clipped to the panel."""
    tables: list[list[Line]] = []
    for split in SPLITS:
        found = snapshot.matrices.get(split)
        if found is None:
            continue
        epoch, counts = found
        size = len(counts)
        cell = max(
            [len(str(k)) for k in range(size)] + [len(str(c)) for row in counts for c in row]
        )
        lines: list[Line] = [
            [(f"{split}, epoch {epoch}: target ↓ predicted →", SPLIT_STYLES[split])]
        ]
        head = " " * (cell + 2) + " ".join(str(k).rjust(cell) for k in range(size))
        lines.append([(head, "dim")])
        for k, row in enumerate(counts):
            line: Line = [(str(k).rjust(cell) + "  ", "dim")]
            for column, count in enumerate(row):
                style = "bold" if column == k else ("" if count else "dim")
                line.append((str(count).rjust(cell) + " ", style))
            lines.append(line)
        tables.append(lines)
    if len(tables) == 2:
        wide = max(cell_len("".join(t for t, _ in line)) for line in tables[0]) + 3
        if wide + max(cell_len("".join(t for t, _ in line)) for line in tables[1]) <= width:
            left = [fit(line, wide) for line in tables[0]]
            left += [[(" " * wide, "")]] * (len(tables[1]) - len(left))
            right = tables[1] + [[]] * (len(left) - len(tables[1]))
            tables = [beside(left, right)]
    lines = [line for table in tables for line in [*table, []]][:height]
    lines = [fit(line, width) for line in lines]
    return lines + blank(width, height - len(lines))


def legend_entries(snapshot: Snapshot) -> list[tuple[str, str, str]]:
    """The chart's legend, as (split, label, value): the training's last value and the
    latest validation's, labelled and valued as the metrics table's columns are
    ("train last", "valid (epoch 2, iteration 400)")."""
    name = snapshot.selected
    unit = snapshot.units.get(name or "", "")
    views = {view.split: view for view in snapshot.views if view.name == name}
    entries = []
    for split, kind in (("train", "last"), ("valid", "epoch"), ("test", "epoch")):
        view = views.get(split)
        if view is not None:
            value = shown_value(snapshot, view, kind)
        elif split in snapshot.histories or split in snapshot.epoch_values:
            history = snapshot.histories.get(split)  # no view yet: the values drawn
            value = history.recent[-1] if history is not None and history.recent else None
        else:
            continue
        if value is None and split == "valid":
            continue  # no validation yet
        entries.append((split, column_label(snapshot, split, kind), format_number(value, unit)))
    return entries


def _legend(snapshot: Snapshot) -> Line:
    line: Line = [(" ", "")]
    for split, label, value in legend_entries(snapshot):
        mark = f"{MARKER} " if split == "valid" else "━━ "
        line.append((mark, SPLIT_STYLES[split]))
        line.append((f"{label} {value}   ", ""))
    return line


def _history_chart(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    series, ends = [], []
    for split in SPLITS:
        history = snapshot.histories.get(split)
        if history is None or not history.count:
            continue
        x, y = history.arrays()
        series.append(Series(x, y, SPLIT_STYLES[split]))
        ends.append(history.last_x or 0.0)
    if snapshot.validations:  # every validation's value where it ran
        xs, ys, _ = zip(*snapshot.validations)
        series.append(Series(xs, ys, f"bold {SPLIT_STYLES['valid']}", marker=MARKER))
        ends.append(max(xs))
    start = float(snapshot.info.start_epoch - 1)
    end = max(ends) if ends else start + 1.0
    if end <= start:
        end = start + 1.0
    first, last = int(start) + 1, math.ceil(end)
    every = max(1, math.ceil((last - first + 1) * 4 / max(1, width - 9)))
    ticks = [(e - 0.5, str(e)) for e in range(first, last + 1, every)]
    return line_chart(series, width, height, (start, end), ticks, caption="epoch")


def _recent_chart(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    windows = {split: h.recent for split, h in snapshot.histories.items() if h.recent}
    longest = max((len(values) for values in windows.values()), default=0)
    series = []
    for split in SPLITS:
        values = windows.get(split)
        if values:
            offset = longest - len(values)
            series.append(Series(range(offset, longest), values, SPLIT_STYLES[split]))
    end = float(max(longest - 1, 1))
    ticks = [(0.0, f"-{longest}"), (end, "now")] if longest else []
    return line_chart(series, width, height, (0.0, end), ticks, caption="iterations")


def _epochs_chart(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    values = snapshot.epoch_values
    epochs = sorted({e for split in values.values() for e in split})
    progress = snapshot.progress
    running: dict[str, float] = {}
    if progress is not None and snapshot.reason is None:
        for view in snapshot.views:
            if (
                view.name == snapshot.selected
                and view.split == progress.split
                and isinstance(view.epoch_value, float)
                and progress.epoch not in values.get(view.split, {})
            ):
                running[view.split] = view.epoch_value
        if running and progress.epoch not in epochs:
            epochs.append(progress.epoch)
    splits = [s for s in SPLITS if s in values or s in running or s in snapshot.histories]
    groups = []
    for epoch in epochs:
        bars: list[tuple[float | None, str]] = []
        for split in splits:
            value, style = values.get(split, {}).get(epoch), SPLIT_STYLES[split]
            if value is None and progress is not None and epoch == progress.epoch:
                value, style = running.get(split), f"dim {style}"
            bars.append((value, style))
        groups.append((str(epoch), bars))
    return bar_chart(groups, width, height, caption="epoch")
