"""Terminal charts drawn with rich text: braille line charts and block bar charts.

Both return exactly `height` lines of exactly `width` cells, so a panel can hold them
without re-wrapping. They cost O(points + width * height) per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from rich.text import Text

# Braille dot bits by (column, row) inside a 2 x 4 cell.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_BLOCKS = " ▁▂▃▄▅▆▇█"
LABEL_WIDTH = 9
AXIS_STYLE = "grey50"


@dataclass(frozen=True)
class Series:
    """One curve: (x, y) points in x order, and the rich style it is drawn in."""

    points: Sequence[tuple[float, float]]
    style: str


def tick(value: float) -> str:
    """An axis label: at most `LABEL_WIDTH - 1` characters."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.1e}"
    if magnitude >= 100:
        return f"{value:.1f}"
    return f"{value:.4g}"


def _y_range(low: float, high: float) -> tuple[float, float]:
    if high - low <= abs(high) * 1e-9 + 1e-12:
        pad = abs(high) * 0.05 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.05
    return low - pad, high + pad


def _empty(width: int, height: int, message: str) -> list[Text]:
    lines = [Text(" " * width) for _ in range(height)]
    if height:
        middle = height // 2
        lines[middle] = Text(message[:width].center(width), style=AXIS_STYLE)
    return lines


def _axis_rows(height: int, low: float, high: float) -> list[str]:
    """Left labels for the plot rows: top, middle and bottom values."""
    labels = [""] * height
    if height >= 1:
        labels[0] = tick(high)
        labels[-1] = tick(low)
    if height >= 5:
        labels[height // 2] = tick((low + high) / 2)
    return [label[: LABEL_WIDTH - 2].rjust(LABEL_WIDTH - 2) + " ┤" if label else " " * (LABEL_WIDTH - 1) + "│" for label in labels]


def x_axis(width: int, x_range: tuple[float, float], ticks: Sequence[tuple[float, str]], caption: str) -> Text:
    """The line under a chart: tick labels placed at their x, then a caption at the right."""
    plot = width - LABEL_WIDTH
    cells = [" "] * plot
    x0, x1 = x_range
    span = (x1 - x0) or 1.0
    taken = -1
    for x, label in ticks:
        if not x0 <= x <= x1:
            continue
        centre = int((x - x0) / span * (plot - 1) + 0.5)
        begin = max(0, min(plot - len(label), centre - len(label) // 2))
        if begin <= taken + 1:
            continue
        cells[begin : begin + len(label)] = list(label)
        taken = begin + len(label)
    text = "".join(cells)
    if caption and len(caption) + 2 <= plot:
        tail = text[plot - len(caption) - 1 :]
        if not tail.strip():
            text = text[: plot - len(caption) - 1] + " " + caption
    return Text(" " * LABEL_WIDTH + text, style=AXIS_STYLE)


def line_chart(
    series: Sequence[Series],
    width: int,
    height: int,
    x_range: tuple[float, float],
    ticks: Sequence[tuple[float, str]] = (),
    caption: str = "",
    empty: str = "waiting for values",
) -> list[Text]:
    """Curves in braille dots (2 x 4 per cell), with a y axis and an x axis line."""
    plot_w, plot_h = width - LABEL_WIDTH, height - 1
    if plot_w < 4 or plot_h < 2:
        return _empty(width, height, "")
    bounds = [y for s in series for _, y in s.points if math.isfinite(y)]
    if not bounds:
        return _empty(width, height, empty)
    low, high = _y_range(min(bounds), max(bounds))
    dots_w, dots_h = plot_w * 2, plot_h * 4
    x0, x1 = x_range
    x_scale = (dots_w - 1) / ((x1 - x0) or 1.0)
    y_scale = (dots_h - 1) / (high - low)
    bits = [[0] * plot_w for _ in range(plot_h)]
    colours: list[list[int]] = [[-1] * plot_w for _ in range(plot_h)]
    for index, curve in enumerate(series):
        # Average the points that fall in the same dot column.
        columns: dict[int, list[float]] = {}
        for x, y in curve.points:
            if not math.isfinite(y):
                continue
            column = int((x - x0) * x_scale + 0.5)
            if 0 <= column < dots_w:
                slot = columns.get(column)
                if slot is None:
                    columns[column] = [y, 1.0]
                else:
                    slot[0] += y
                    slot[1] += 1.0
        previous: tuple[int, int] | None = None
        for column in sorted(columns):
            total, n = columns[column]
            row = dots_h - 1 - int((total / n - low) * y_scale + 0.5)
            row = min(dots_h - 1, max(0, row))
            if previous is None:
                _dot(bits, colours, column, row, index)
            else:
                _segment(bits, colours, previous, (column, row), index)
            previous = (column, row)
    labels = _axis_rows(plot_h, low, high)
    lines = []
    for r in range(plot_h):
        line = Text(labels[r], style=AXIS_STYLE)
        row_bits, row_colours = bits[r], colours[r]
        start = 0
        while start < plot_w:
            colour = row_colours[start]
            end = start + 1
            while end < plot_w and row_colours[end] == colour:
                end += 1
            chunk = "".join(chr(0x2800 + b) if b else " " for b in row_bits[start:end])
            line.append(chunk, style=series[colour].style if colour >= 0 else "")
            start = end
        lines.append(line)
    lines.append(x_axis(width, x_range, ticks, caption))
    return lines


def _dot(bits: list[list[int]], colours: list[list[int]], x: int, y: int, colour: int) -> None:
    cell_x, cell_y = x >> 1, y >> 2
    bits[cell_y][cell_x] |= _DOTS[x & 1][y & 3]
    colours[cell_y][cell_x] = colour


def _segment(
    bits: list[list[int]], colours: list[list[int]], a: tuple[int, int], b: tuple[int, int], colour: int
) -> None:
    (xa, ya), (xb, yb) = a, b
    steps = max(abs(xb - xa), abs(yb - ya), 1)
    for step in range(1, steps + 1):
        t = step / steps
        _dot(bits, colours, int(xa + (xb - xa) * t + 0.5), int(ya + (yb - ya) * t + 0.5), colour)


def bar_chart(
    groups: Sequence[tuple[str, Sequence[tuple[float | None, str]]]],
    width: int,
    height: int,
    caption: str = "",
    empty: str = "no epoch finished yet",
) -> list[Text]:
    """Grouped vertical bars in eighth-block steps: one group per label (an epoch), one bar
    per (value, style) in it. Shows the last groups that fit the width."""
    plot_w, plot_h = width - LABEL_WIDTH, height - 1
    if plot_w < 4 or plot_h < 2:
        return _empty(width, height, "")
    values = [v for _, bars in groups for v, _ in bars if v is not None and math.isfinite(v)]
    if not values:
        return _empty(width, height, empty)
    per_group = max(len(bars) for _, bars in groups) or 1
    gap = 2
    bar_w = max(1, min(5, (plot_w // max(len(groups), 1) - gap) // per_group))
    group_w = bar_w * per_group + gap
    shown = list(groups)[-max(1, plot_w // group_w) :]
    low, high = min(values), max(values)
    base = 0.0 if low >= 0 else low
    if high <= base:
        high = base + (abs(base) or 1.0)
    eighths = plot_h * 8
    scale = eighths / (high - base)
    labels = _axis_rows(plot_h, base, high)
    columns: list[tuple[int, str]] = []  # (height in eighths or -1 for a blank, style)
    for _, bars in shown:
        for position in range(per_group):
            value, style = bars[position] if position < len(bars) else (None, "")
            level = -1
            if value is not None and math.isfinite(value):
                level = max(1, int((value - base) * scale + 0.5))
            columns.extend([(level, style)] * bar_w)
        columns.extend([(-1, "")] * gap)
    columns = columns[:plot_w]
    lines = []
    for r in range(plot_h):
        floor = (plot_h - 1 - r) * 8
        cells = []
        for level, style in columns:
            fill = 0 if level < 0 else min(8, max(0, level - floor))
            cells.append((_BLOCKS[fill], style if fill else ""))
        cells.extend([(" ", "")] * (plot_w - len(columns)))
        lines.append(_join(labels[r], cells))
    ticks = "".join(label[:group_w].center(group_w - gap + 1).ljust(group_w) for label, _ in shown)
    axis = ticks[:plot_w].ljust(plot_w)
    if caption and len(caption) + 2 <= plot_w and not axis[plot_w - len(caption) - 1 :].strip():
        axis = axis[: plot_w - len(caption) - 1] + " " + caption
    lines.append(Text(" " * LABEL_WIDTH + axis, style=AXIS_STYLE))
    return lines


def _join(label: str, cells: Sequence[tuple[str, str]]) -> Text:
    """A chart row: the axis label, then the cells grouped into runs of one style."""
    line = Text(label, style=AXIS_STYLE)
    start, total = 0, len(cells)
    while start < total:
        style = cells[start][1]
        end = start + 1
        while end < total and cells[end][1] == style:
            end += 1
        line.append("".join(char for char, _ in cells[start:end]), style=style)
        start = end
    return line
