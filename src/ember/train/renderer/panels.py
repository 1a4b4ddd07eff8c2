"""The dashboard's panels, drawn from a `Snapshot` of the run (no locks, no threads here).

Panels are composed as plain (text, style) runs of known width rather than rich
layouts: a whole frame costs about a millisecond, so drawing it ten times a second
takes little from the training thread.
"""

from __future__ import annotations

import math
from typing import Sequence

from rich.cells import cell_len, set_cell_size

from ember.train.renderer.charts import Line, Series, bar_chart, blank, line_chart
from ember.train.renderer.format import format_compact, format_duration, format_number
from ember.train.renderer.state import (
    METRIC_COLUMNS,
    SPLITS,
    Snapshot,
    cell_text,
    metric_rows,
    shown_value,
)

VIEWS = ("history", "recent", "epochs")
"""The chart views, in the order up/down cycles through them."""
SPLIT_STYLES = {"train": "cyan", "valid": "magenta"}
BORDER = "grey42"
LABEL = "grey62"
STATUS_WIDTH = 34
PROGRESS_HEIGHT = 4
FULL_HEIGHT = 16
"""The fewest lines that hold every panel, the chart included."""
PLOT_MIN = 8
"""The chart's lines (a legend and four rows of plot) the metrics table leaves it."""


# Lines -------------------------------------------------------------------------------
def fit(line: Line, width: int) -> Line:
    """`line` cropped or padded to exactly `width` cells."""
    out: Line = []
    used = 0
    for text, style in line:
        size = cell_len(text)
        if used + size > width:
            room = width - used
            if room > 0:
                out.append((set_cell_size(text, room), style))
            return out
        out.append((text, style))
        used += size
    if used < width:
        out.append((" " * (width - used), ""))
    return out


def box(
    title: Line,
    body: Sequence[Line],
    width: int,
    height: int,
    subtitle: str = "",
    subtitle_style: str = BORDER,
) -> list[Line]:
    """A rounded box of `width` x `height` around `body` (cropped or padded to fit),
    with `subtitle` at the right of its bottom border if it fits there."""
    inner = width - 4
    head = fit([("╭─ ", BORDER), *title, (" ", BORDER)], width - 1)
    if cell_len(head[-1][0]) and head[-1][1] == "" and not head[-1][0].strip():
        head[-1] = ("─" * len(head[-1][0]), BORDER)
    lines: list[Line] = [[*head, ("╮", BORDER)]]
    for index in range(height - 2):
        content = body[index] if index < len(body) else []
        lines.append([("│ ", BORDER), *fit(content, inner), (" │", BORDER)])
    if subtitle and cell_len(subtitle) + 6 <= width:
        lead = "╰" + "─" * (width - 5 - cell_len(subtitle)) + " "
        lines.append([(lead, BORDER), (subtitle, subtitle_style), (" ─╯", BORDER)])
    else:
        lines.append([("╰" + "─" * (width - 2) + "╯", BORDER)])
    return lines


def beside(left: Sequence[Line], right: Sequence[Line]) -> list[Line]:
    return [[*a, *b] for a, b in zip(left, right)]


# The frame ---------------------------------------------------------------------------
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


def metrics_window(snapshot: Snapshot, count: int, shown: int) -> int:
    """The first of `count` metrics table rows to show when `shown` fit: from
    `snapshot.scroll`, moved so that the selected metric is shown if `snapshot.follow`,
    and never past the end."""
    first = min(max(0, snapshot.scroll), max(0, count - shown))
    if snapshot.follow and shown > 0 and snapshot.selected is not None:
        names = [name for name, _, _ in metric_rows(snapshot)]
        if snapshot.selected in names:
            index = names.index(snapshot.selected)
            if index < first:
                first = index
            elif index >= first + shown:
                first = index - shown + 1
    return first


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
    state = snapshot.reason if snapshot.reason is not None else "training"
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


_COLUMN_PRIORITY = (("train", "last"), ("valid", "last"), ("train", "epoch"), ("valid", "epoch"))
CELL = 12
SHORT_CELL = 7
"""The width of a short number ("0.5123", "1.23e-5"): columns keep it as values change."""
NAME_MIN = 10
"""The fewest cells a metric's name is cut to (with "…") before columns are left out."""


def _splits(snapshot: Snapshot, rows: list) -> list[str]:
    """The splits the table has columns for: those with a metric (both when none has)."""
    present = {split for _, _, splits in rows for split in splits}
    present |= {split for split, _, _, _ in snapshot.info.metrics}
    return [split for split in SPLITS if split in present] or list(SPLITS)


Table = tuple[Line, Line, list[Line], int]
"""A metrics table: the box title, the header line, a line per metric, and how many
columns it leaves out."""


def _table(snapshot: Snapshot, rows: list, inner: int) -> Table:
    """The metrics table in `inner` cells. Every value is shown whole: in full with its
    unit ("91.2345 %") under headers "train last" ... where that fits, else as short
    numbers (`_short_table`)."""
    splits = _splits(snapshot, rows)
    columns = [column for column in METRIC_COLUMNS if column[0] in splits]
    need = max((2 + cell_len(name) for name, _, _ in rows), default=8)  # "▸ " + name
    full = [
        [cell_text(snapshot, row_splits.get(split), kind, unit) for _, unit, row_splits in rows]
        for split, kind in columns
    ]
    widths = [max([CELL - 1, *(cell_len(text) for text in texts)]) for texts in full]
    name_w = inner - sum(1 + w for w in widths)
    if need > name_w:
        return _short_table(snapshot, rows, inner, splits, columns, need)
    head: Line = [(set_cell_size("  metric", name_w), "bold")]
    head += [(f" {split} {kind}".rjust(1 + w), "bold") for (split, kind), w in zip(columns, widths)]
    lines = []
    for index, (name, _, _) in enumerate(rows):
        line = _name_cell(snapshot, name, "", name_w)
        line += [
            (" " + texts[index].rjust(w), SPLIT_STYLES[split])
            for (split, _), texts, w in zip(columns, full, widths)
        ]
        lines.append(line)
    return [("metrics", "bold")], head, lines, 0


def _short_table(
    snapshot: Snapshot,
    rows: list,
    inner: int,
    splits: list[str],
    columns: list[tuple[str, str]],
    need: int,
) -> Table:
    """The metrics table with values in at most 7 characters ("91.23", "1.23e-5") under
    "last" and "epoch", each split named in the box's top border above its columns, and
    units after the metrics' names where they fit. Names that still do not fit are cut
    with "…"; only then are columns left out, the least useful first."""
    short = [
        [
            format_compact(shown_value(snapshot, row_splits[split], kind))
            if split in row_splits
            else ""
            for _, _, row_splits in rows
        ]
        for split, kind in columns
    ]
    widths = [max([SHORT_CELL, *(cell_len(text) for text in texts)]) for texts in short]
    kept = list(range(len(columns)))
    dropping = [columns.index(c) for c in reversed(_COLUMN_PRIORITY) if c in columns]
    while kept and min(need, NAME_MIN) + sum(1 + widths[i] for i in kept) > inner:
        kept.remove(dropping.pop(0))
    name_w = max(1, inner - sum(1 + widths[i] for i in kept))
    head: Line = [(set_cell_size("  metric", name_w), "bold")]
    head += [(columns[i][1].rjust(1 + widths[i]), "bold") for i in kept]
    lines = []
    for index, (name, unit, _) in enumerate(rows):
        line = _name_cell(snapshot, name, unit, name_w)
        line += [
            (" " + short[i][index].rjust(widths[i]), SPLIT_STYLES[columns[i][0]]) for i in kept
        ]
        lines.append(line)
    # The top border: "╭─ metrics ──── train ──── valid ─╮", each split over its columns.
    title: Line = [("metrics", "bold"), (" ", BORDER)]
    used = 3 + cell_len("metrics") + 1  # the cells "╭─ metrics " take
    start = 2 + name_w  # where the value columns begin ("│ " and the name column before)
    for split in splits:
        spans = [i for i in kept if columns[i][0] == split]
        if not spans:
            continue
        begin = start + sum(1 + widths[i] for i in kept if i < spans[0]) + 1
        end = start + sum(1 + widths[i] for i in kept if i <= spans[-1])
        label = f" {split} "
        at = begin + max(0, (end - begin - len(label)) // 2)
        if at >= used:
            title += [("─" * (at - used), BORDER), (label, SPLIT_STYLES[split])]
            used = at + len(label)
    title[-1] = (title[-1][0].rstrip(), title[-1][1])  # the box puts a blank after the title
    return title, head, lines, len(columns) - len(kept)


def _name_cell(snapshot: Snapshot, name: str, unit: str, width: int) -> Line:
    """A metric's name (marked if selected, cut with "…" if too long), then its unit if
    it fits, in exactly `width` cells."""
    selected = name == snapshot.selected
    text = ("▸ " if selected else "  ") + name
    style = "bold" if selected else ""
    if cell_len(text) > width:
        return fit([(set_cell_size(text, max(0, width - 1)).rstrip() + "…"[:width], style)], width)
    line: Line = [(text, style)]
    if unit and cell_len(text) + 1 + cell_len(unit) <= width:
        line.append((" " + unit, LABEL))
    return fit(line, width)


def metrics_panel(snapshot: Snapshot, rows: list, width: int, height: int) -> list[Line]:
    """Each metric's last value and epoch value per split, as many rows as fit from
    where the table is scrolled to; the bottom border says how many are above and
    below, and which keys scroll."""
    inner = width - 4
    shown = max(0, min(len(rows), height - 3))
    first = metrics_window(snapshot, len(rows), shown)
    title, head, lines, hidden = _table(snapshot, rows, inner)
    body = [head, *lines[first : first + shown]]
    if not rows:
        body.append([("  no metric registered", LABEL)])
    hint = _hidden_hint(first, len(rows) - first - shown, hidden, width)
    return box(title, body, width, height, hint, "bold yellow")


def _hidden_hint(above: int, below: int, columns: int, width: int) -> str:
    """What the metrics table does not show, for its bottom border: "▴ 1 above · ▾ 2
    more · PgUp PgDn", "1 column hidden"; shorter where the border is short."""
    parts = ([f"▴ {above} above"] if above else []) + ([f"▾ {below} more"] if below else [])
    keys = " ".join((["PgUp"] if above else []) + (["PgDn"] if below else []))
    short = ([f"▴{above}"] if above else []) + ([f"▾{below}"] if below else [])
    if columns:
        parts.append(f"{columns} column{'s' if columns > 1 else ''} hidden")
        short.append(f"+{columns} col")
    if not parts:
        return ""
    for hint in (" · ".join([*parts, keys] if keys else parts), " · ".join(parts), " ".join(short)):
        if cell_len(hint) + 6 <= width:
            return hint
    return ""


def status_panel(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    progress, info = snapshot.progress, snapshot.info
    rows: list[tuple[str, str, str]] = []
    if progress is None:
        rows.append(("mode", "starting", ""))
        rows.append(("epoch", f"{info.start_epoch}/{info.num_epochs}", ""))
    else:
        rows.append(("mode", progress.split, f"bold {SPLIT_STYLES.get(progress.split, '')}"))
        rows.append(("epoch", f"{progress.epoch}/{progress.num_epochs}", ""))
        total = f"/{progress.num_iterations}" if progress.num_iterations else ""
        rows.append(("iteration", f"{progress.iteration}{total}", ""))
        rows.append(("items", f"{progress.items:,}", ""))
        if progress.run:
            unit, _, done = progress.run.partition(" ")
            rows.append((unit, done, ""))
    rows.append(("elapsed", format_duration(snapshot.elapsed), ""))
    if snapshot.eta is not None and snapshot.reason is None:
        rows.append(("eta", format_duration(snapshot.eta), ""))
    body = [[(f"{label:<10}", LABEL), (value, style)] for label, value, style in rows]
    return box([("status", "bold")], body, width, height)


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
    for split in ("train", "valid"):
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


def _legend(snapshot: Snapshot) -> Line:
    line: Line = [(" ", "")]
    unit = snapshot.units.get(snapshot.selected or "", "")
    for split in ("train", "valid"):
        history = snapshot.histories.get(split)
        if history is None and split not in snapshot.epoch_values:
            continue
        last = history.recent[-1] if history is not None and history.recent else None
        line.append(("━━ ", SPLIT_STYLES[split]))
        line.append((f"{split} {format_number(last, unit)}   ", ""))
    return line


def _history_chart(snapshot: Snapshot, width: int, height: int) -> list[Line]:
    series, ends = [], []
    for split in ("train", "valid"):
        history = snapshot.histories.get(split)
        if history is None or not history.count:
            continue
        x, y = history.arrays()
        series.append(Series(x, y, SPLIT_STYLES[split]))
        ends.append(history.last_x or 0.0)
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
    for split in ("train", "valid"):
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
    splits = [
        s for s in ("train", "valid") if s in values or s in running or s in snapshot.histories
    ]
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


def _bar(fraction: float, width: int, style: str) -> Line:
    done = round(min(1.0, max(0.0, fraction)) * width)
    return [("━" * done, style), ("━" * (width - done), "grey23")]


def progress_panel(snapshot: Snapshot, width: int) -> list[Line]:
    progress = snapshot.progress
    bar_w = max(4, width - 4 - 51)
    if progress is None:
        fraction, label, style, rate = 0.0, "starting", "cyan", ""
    else:
        total = progress.num_iterations
        fraction = progress.iteration / total if total else 0.0
        label = f"{progress.split} {progress.iteration}{f'/{total}' if total else ''}"
        style = SPLIT_STYLES.get(progress.split, "cyan")
        rate = f"{progress.items_per_second:,.0f} items/s"
    epoch_line: Line = [("epoch ", LABEL), *_bar(fraction, bar_w, style)]
    epoch_line.append((f" {100 * fraction:5.1f}%  {label:<16} {rate:>18}", ""))
    overall = snapshot.fraction or 0.0
    epoch = f"epoch {progress.epoch}/{progress.num_epochs}" if progress else ""
    if snapshot.reason is not None:
        eta = f"took {format_duration(snapshot.elapsed)}"
    else:
        eta = f"eta {format_duration(snapshot.eta)}" if snapshot.eta is not None else "eta -"
    total_line: Line = [("total ", LABEL), *_bar(overall, bar_w, "green")]
    total_line.append((f" {100 * overall:5.1f}%  {epoch:<16} {eta:>18}", ""))
    return box([("progress", "bold")], [epoch_line, total_line], width, PROGRESS_HEIGHT)


def footer(snapshot: Snapshot, width: int) -> Line:
    if snapshot.closing:
        return [(f" training {snapshot.reason} · press any key to close ", "bold reverse")]
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
        return [(f" training {snapshot.reason}", "bold")]
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
