"""Terminal charts: braille line charts and block bar charts.

Both return exactly `height` lines of exactly `width` cells. A line is a list of
(text, style) runs. The work is done with numpy over at most a few thousand points, so
a chart costs well under a millisecond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

Line = list[tuple[str, str]]
"""One terminal line as (text, rich style) runs."""

LABEL_WIDTH = 9
AXIS_STYLE = "grey50"
# Braille dot bits by [column within the cell, row within the cell].
_DOT_BITS = np.array([[0x01, 0x02, 0x04, 0x40], [0x08, 0x10, 0x20, 0x80]], dtype=np.uint32)
_BLOCKS = np.array([ord(c) for c in " ▁▂▃▄▅▆▇█"], dtype=np.uint32)


@dataclass(frozen=True)
class Series:
    """One curve: x and y values (x ascending) and the rich style it is drawn in; with
    a `marker` (one character, e.g. "●"), a mark in the cell of each point instead of
    a line (drawn over the curves)."""

    x: Sequence[float] | np.ndarray
    y: Sequence[float] | np.ndarray
    style: str
    marker: str = ""


def tick(value: float, digits: int = 0) -> str:
    """An axis label of at most `LABEL_WIDTH - 2` characters; `digits` asks for that
    many more significant digits than usual, as far as they fit."""
    if value == 0:
        return "0"
    room = LABEL_WIDTH - 2
    magnitude = abs(value)
    if magnitude >= 1e5 and digits and len(f"{value:.0f}") <= room:
        return f"{value:.0f}"  # every digit there is: 123456 rather than 1.235e5
    if magnitude >= 1e5 or magnitude < 1e-3:
        for decimals in range(1 + digits, -1, -1):
            text = f"{value:.{decimals}e}"
            if len(text) > room:  # 1.2e-5 rather than 1.2e-05
                mantissa, exponent = text.split("e")
                text = f"{mantissa}e{int(exponent)}"
            if len(text) <= room:
                return text
        return text
    if magnitude >= 100:
        for decimals in range(1 + digits, -1, -1):
            text = f"{value:.{decimals}f}"
            if len(text) <= room:
                return text
        return text
    for significant in range(4 + digits, 0, -1):
        text = f"{value:.{significant}g}"
        if len(text) <= room:
            return text
    return text


def tick_labels(values: Sequence[float]) -> list[str]:
    """Axis labels for `values`, as short as `tick` makes them but never two alike:
    values that round to the same label get more digits, as many as fit. A label
    that would still repeat one before it (values closer than the labels can tell
    apart) is left empty rather than drawn twice."""
    labels = [tick(value) for value in values]
    digits = 0
    while not _distinct(labels) and digits < LABEL_WIDTH:
        digits += 1
        more = [tick(value, digits) for value in values]
        if more == labels:
            break  # no room for another digit
        labels = more
    seen: set[float] = set()
    out = []
    for label in labels:
        number = float(label)
        out.append("" if number in seen else label)
        seen.add(number)
    return out


def _distinct(labels: Sequence[str]) -> bool:
    """Whether no two labels read as the same number ("100" and "100.0" do)."""
    return len({float(label) for label in labels}) == len(labels)


def y_range(low: float, high: float) -> tuple[float, float]:
    """The shown range: the data with 5 % to spare, not below 0 for data that is not."""
    if high - low <= abs(high) * 1e-9 + 1e-12:
        pad = abs(high) * 0.05 or 1.0
    else:
        pad = (high - low) * 0.05
    bottom = low - pad
    if low >= 0 > bottom:
        bottom = 0.0
    return bottom, high + pad


def blank(width: int, height: int, message: str = "") -> list[Line]:
    """An empty chart area with `message` in its middle."""
    lines: list[Line] = [[(" " * width, "")] for _ in range(height)]
    if height and message:
        lines[height // 2] = [(message[:width].center(width), AXIS_STYLE)]
    return lines


def _labels(height: int, low: float, high: float) -> list[str]:
    """The y axis, one string of `LABEL_WIDTH` cells per plot row."""
    values = [""] * height
    rows = [0, height // 2, height - 1] if height >= 5 else [0, height - 1]
    numbers = [high, (low + high) / 2, low] if height >= 5 else [high, low]
    for row, label in zip(rows, tick_labels(numbers)):
        values[row] = label
    return [
        v[: LABEL_WIDTH - 2].rjust(LABEL_WIDTH - 2) + " ┤" if v else " " * (LABEL_WIDTH - 1) + "│"
        for v in values
    ]


def x_axis(
    width: int, x_range: tuple[float, float], ticks: Sequence[tuple[float, str]], caption: str
) -> Line:
    """The line under a chart: tick labels centred on their x, a caption at the right."""
    plot = width - LABEL_WIDTH
    cells = [" "] * plot
    x0, x1 = x_range
    span = (x1 - x0) or 1.0
    free = 0  # the first cell a label may use (one blank after the previous label)
    for x, label in ticks:
        if not x0 <= x <= x1 or len(label) > plot:
            continue
        centre = int((x - x0) / span * (plot - 1) + 0.5)
        begin = max(0, min(plot - len(label), centre - len(label) // 2))
        if begin < free:
            continue
        cells[begin : begin + len(label)] = list(label)
        free = begin + len(label) + 1
    text = "".join(cells)
    if caption and len(caption) + 2 <= plot and not text[plot - len(caption) - 1 :].strip():
        text = text[: plot - len(caption) - 1] + " " + caption
    return [(" " * LABEL_WIDTH + text, AXIS_STYLE)]


def _runs(codepoints: np.ndarray, owners: np.ndarray, styles: Sequence[str]) -> list[Line]:
    """Rows of cells as runs of one owner's style. Unowned cells join the run before
    them (a blank looks the same in any colour), so a row has few runs."""
    height, width = codepoints.shape
    marked = np.where(owners >= 0, np.arange(width)[None, :], -1)
    np.maximum.accumulate(marked, axis=1, out=marked)
    filled = np.where(marked >= 0, np.take_along_axis(owners, np.maximum(marked, 0), axis=1), -1)
    text = codepoints.astype("<u4").tobytes().decode("utf-32-le")
    cut_rows, cut_columns = np.nonzero(np.diff(filled, axis=1))
    firsts = filled[:, 0].tolist()
    cuts: list[list[int]] = [[] for _ in range(height)]
    for row, column in zip(cut_rows.tolist(), cut_columns.tolist()):
        cuts[row].append(column + 1)
    lines: list[Line] = []
    for row in range(height):
        base = row * width
        line: Line = []
        start, owner = 0, firsts[row]
        for end in [*cuts[row], width]:
            line.append((text[base + start : base + end], styles[owner] if owner >= 0 else ""))
            if end < width:
                owner = int(filled[row, end])
            start = end
        lines.append(line)
    return lines


def line_chart(
    series: Sequence[Series],
    width: int,
    height: int,
    x_range: tuple[float, float],
    ticks: Sequence[tuple[float, str]] = (),
    caption: str = "",
    empty: str = "waiting for values",
) -> list[Line]:
    """Curves in braille dots (2 x 4 per cell), points in one dot column averaged, and
    marker series as one character per point, with a y axis at the left and an x axis
    line at the bottom."""
    plot_w, plot_h = width - LABEL_WIDTH, height - 1
    if plot_w < 4 or plot_h < 2:
        return blank(width, height)
    curves = []
    for curve in series:
        xs = np.asarray(curve.x, dtype=np.float64)
        ys = np.asarray(curve.y, dtype=np.float64)
        keep = np.isfinite(ys) & np.isfinite(xs)
        curves.append((xs[keep], ys[keep]))
    present = [ys for _, ys in curves if ys.size]
    if not present:
        return blank(width, height, empty)
    low, high = y_range(min(float(y.min()) for y in present), max(float(y.max()) for y in present))
    dots_w, dots_h = plot_w * 2, plot_h * 4
    x0, x1 = x_range
    x_scale = (dots_w - 1) / ((x1 - x0) or 1.0)
    y_scale = (dots_h - 1) / (high - low)
    bits = np.zeros((plot_h, plot_w), dtype=np.uint32)
    owners = np.full((plot_h, plot_w), -1, dtype=np.int64)
    marks: list[tuple[int, np.ndarray, np.ndarray]] = []
    for index, (xs, ys) in enumerate(curves):
        if not ys.size:
            continue
        if series[index].marker:
            marks.append((index, xs, ys))
            continue
        columns = np.rint((xs - x0) * x_scale).astype(np.int64)
        inside = (columns >= 0) & (columns < dots_w)
        columns, ys = columns[inside], ys[inside]
        if not columns.size:
            continue
        sums = np.bincount(columns, weights=ys, minlength=dots_w)
        counts = np.bincount(columns, minlength=dots_w)
        used = np.flatnonzero(counts)
        rows = (dots_h - 1) - np.rint((sums[used] / counts[used] - low) * y_scale)
        # Every dot column between the first and last point, rows interpolated, and a
        # vertical stroke to the previous column's row so steep parts stay connected.
        span = np.arange(used[0], used[-1] + 1)
        row = np.clip(np.rint(np.interp(span, used, rows)), 0, dots_h - 1).astype(np.int64)
        previous = np.concatenate((row[:1], row[:-1]))
        top, bottom = np.minimum(row, previous), np.maximum(row, previous)
        lengths = bottom - top + 1
        dot_x = np.repeat(span, lengths)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        dot_y = np.repeat(top, lengths) + (np.arange(dot_x.size) - starts)
        cell_y, cell_x = dot_y >> 2, dot_x >> 1
        np.bitwise_or.at(bits, (cell_y, cell_x), _DOT_BITS[dot_x & 1, dot_y & 3])
        owners[cell_y, cell_x] = index
    codepoints = np.where(bits > 0, bits + 0x2800, 0x20)
    for index, xs, ys in marks:
        cell_x = np.rint((xs - x0) * x_scale).astype(np.int64) >> 1
        cell_y = ((dots_h - 1) - np.rint((ys - low) * y_scale)).astype(np.int64) >> 2
        inside = (cell_x >= 0) & (cell_x < plot_w) & (cell_y >= 0) & (cell_y < plot_h)
        codepoints[cell_y[inside], cell_x[inside]] = ord(series[index].marker[0])
        owners[cell_y[inside], cell_x[inside]] = index
    labels = _labels(plot_h, low, high)
    runs = _runs(codepoints, owners, [curve.style for curve in series])
    lines = [[(label, AXIS_STYLE), *run] for label, run in zip(labels, runs)]
    lines.append(x_axis(width, x_range, ticks, caption))
    return lines


def bar_chart(
    groups: Sequence[tuple[str, Sequence[tuple[float | None, str]]]],
    width: int,
    height: int,
    caption: str = "",
    empty: str = "no epoch finished yet",
) -> list[Line]:
    """Grouped vertical bars in eighth-block steps: one group per label (an epoch), one
    bar per (value, style) in it. The last groups that fit the width are shown."""
    plot_w, plot_h = width - LABEL_WIDTH, height - 1
    if plot_w < 4 or plot_h < 2:
        return blank(width, height)
    values = [v for _, bars in groups for v, _ in bars if v is not None and math.isfinite(v)]
    if not values:
        return blank(width, height, empty)
    per_group = max(len(bars) for _, bars in groups) or 1
    gap = 2
    bar_w = max(1, min(6, (plot_w // max(len(groups), 1) - gap) // per_group))
    group_w = bar_w * per_group + gap
    shown = list(groups)[-max(1, plot_w // group_w) :]
    values = [
        v for _, bars in shown for v, _ in bars if v is not None and math.isfinite(v)
    ] or values
    low, high = min(values), max(values)
    base = 0.0 if low >= 0 else low
    if high <= base:
        high = base + (abs(base) or 1.0)
    scale = plot_h * 8 / (high - base)
    styles: list[str] = []
    levels = np.full(plot_w, -1, dtype=np.int64)
    owners = np.full(plot_w, -1, dtype=np.int64)
    column = 0
    for _, bars in shown:
        for position in range(per_group):
            value, style = bars[position] if position < len(bars) else (None, "")
            if value is not None and math.isfinite(value):
                styles.append(style)
                levels[column : column + bar_w] = max(1, int((value - base) * scale + 0.5))
                owners[column : column + bar_w] = len(styles) - 1
            column += bar_w
        column += gap
    labels = _labels(plot_h, base, high)
    floors = (plot_h - 1 - np.arange(plot_h))[:, None] * 8
    fill = np.clip(levels[None, :] - floors, 0, 8)
    rows = _runs(_BLOCKS[fill], np.broadcast_to(owners, fill.shape), styles)
    lines = [[(label, AXIS_STYLE), *row] for label, row in zip(labels, rows)]
    axis = "".join(label[: group_w - 1].center(group_w - gap).ljust(group_w) for label, _ in shown)[
        :plot_w
    ].ljust(plot_w)
    if caption and len(caption) + 2 <= plot_w and not axis[plot_w - len(caption) - 1 :].strip():
        axis = axis[: plot_w - len(caption) - 1] + " " + caption
    lines.append([(" " * LABEL_WIDTH + axis, AXIS_STYLE)])
    return lines
