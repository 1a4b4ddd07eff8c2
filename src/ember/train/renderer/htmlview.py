"""The notebook display's views of a run: self-contained HTML, and a plain-text summary.

The HTML uses inline styles and inline SVG only: no script, no style sheet, nothing
fetched. Its colours read on light and dark themes alike: text and axes take the
theme's own colour (`currentColor`), frames and tracks are translucent grey, and the
two splits are drawn in mid-tone blue and magenta. Every curve is thinned to at most
`POINTS` points and every chart to at most `MARKERS` epoch markers per split, so the
page keeps the same size however long the run. Every name that comes from the user
(model, directory, metrics, units) is escaped.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ember.train.renderer.charts import tick_labels, y_range
from ember.train.renderer.format import format_duration, format_number
from ember.train.renderer.history import HistoryView
from ember.train.renderer.state import (
    SPLITS,
    Mark,
    MetricSeries,
    Snapshot,
    cell_text,
    column_label,
    columns,
    metric_rows,
)

COLOURS = {"train": "#2b8cd6", "valid": "#d1439b", "test": "#d98a1c"}
TOTAL_COLOUR = "#3a9d55"
FRAME = "rgba(128,128,128,0.35)"
TRACK = "rgba(128,128,128,0.22)"
TINTS = {
    "training": "rgba(43,140,214,0.22)",
    "evaluating": "rgba(43,140,214,0.22)",
    "completed": "rgba(58,157,85,0.25)",
    "stopping": "rgba(226,160,20,0.28)",
    "stopped": "rgba(226,160,20,0.28)",
    "failed": "rgba(220,60,60,0.28)",
}
"""The state badge's background by the state's first word (others: as `failed`)."""
CHART_WIDTH, CHART_HEIGHT = 280, 150
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 8, 22
"""The plot area's margins inside a chart, in pixels."""
POINTS = 120
"""The most points of one curve (about two pixels apart)."""
MARKERS = 24
"""The most epoch markers per split; a longer run draws its epoch values as a dashed line."""
MAX_TICKS = 6
MARKER_RADIUS = {"train": 3, "valid": 4, "test": 4}
MARKER_STYLE = {
    "train": 'fill="{colour}"',
    "valid": 'fill="none" stroke="{colour}" stroke-width="1.6"',
    "test": 'fill="none" stroke="{colour}" stroke-width="1.6"',
}
"""Train epoch values as dots, valid ones as rings around them: both show where they meet."""
POINT_SIZE = 3.5
"""Half the diagonal of the diamond that marks a validation inside an epoch."""


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def state(snapshot: Snapshot) -> str:
    """The run's state: training, "stopping: <why>", or how it ended (`end`'s reason)."""
    if snapshot.reason is not None:
        return snapshot.reason
    return snapshot.notice or snapshot.info.activity


def table_rows(snapshot: Snapshot) -> list[tuple[str, list[str]]]:
    """(metric name, its formatted cells in `columns` order) per metric."""
    rows = []
    for name, unit, splits in metric_rows(snapshot):
        cells = [
            cell_text(snapshot, splits.get(split), kind, unit) for split, kind in columns(snapshot)
        ]
        rows.append((name, cells))
    return rows


def _progress_texts(snapshot: Snapshot) -> tuple[str, float, str, str]:
    """(where the run is, share of its epoch done, position and speed, timing)."""
    progress = snapshot.progress
    if progress is None:
        where = f"starting · epoch {snapshot.info.start_epoch}/{snapshot.info.num_epochs}"
        within, position = 0.0, ""
    else:
        total = progress.num_iterations
        where = f"{progress.split} · epoch {progress.epoch}/{progress.num_epochs}"
        within = progress.iteration / total if total else 0.0
        position = (
            f"iteration {progress.iteration}{f'/{total}' if total else ''} · "
            f"{progress.split} {progress.items_per_second:,.0f} items/s"
        )
    if snapshot.reason is not None:
        timing = f"took {format_duration(snapshot.elapsed)}"
    else:
        timing = f"elapsed {format_duration(snapshot.elapsed)}"
        timing += f" · eta {format_duration(snapshot.eta)}" if snapshot.eta is not None else ""
    return where, within, position, timing


# Plain text --------------------------------------------------------------------------
def plain(snapshot: Snapshot) -> str:
    """A few lines: the run, where it stands, and the metrics table."""
    info = snapshot.info
    where, _, position, timing = _progress_texts(snapshot)
    overall = f"total {100 * (snapshot.fraction or 0.0):.1f}%"
    lines = [
        f"ember · {info.model_name} · {info.num_parameters:,} parameters · "
        f"{', '.join(info.devices)} · {info.artifact_dir} · {state(snapshot)}",
        " · ".join(part for part in (where, position, timing, overall) if part),
    ]
    rows = table_rows(snapshot)
    if rows:
        head = ["metric", *(column_label(snapshot, s, kind) for s, kind in columns(snapshot))]
        table = [head, *([name, *cells] for name, cells in rows)]
        widths = [max(len(row[column]) for row in table) for column in range(len(head))]
        for row in table:
            cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]
            lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# HTML ----------------------------------------------------------------------------------
def page(snapshot: Snapshot, series: Mapping[str, MetricSeries], hidden: int = 0) -> str:
    """The whole view: header, progress, metrics table, then a chart per metric of
    `series` (`hidden` more numeric metrics are only named as left out)."""
    return "".join(
        (
            '<div style="font-family:var(--jp-ui-font-family,system-ui,sans-serif);'
            "font-size:13px;line-height:1.45;color:inherit;max-width:1000px;"
            f'border:1px solid {FRAME};border-radius:6px;padding:10px 12px">',
            header(snapshot),
            progress(snapshot),
            table(snapshot),
            charts(snapshot, series, hidden),
            "</div>",
        )
    )


def header(snapshot: Snapshot) -> str:
    info = snapshot.info
    now = state(snapshot)
    tint = TINTS.get(now.split(":")[0].split(" ")[0], TINTS["failed"])
    about = f"{info.num_parameters:,} parameters · {', '.join(info.devices)}"
    return (
        '<div style="display:flex;flex-wrap:wrap;align-items:center;gap:4px 10px">'
        f'<span style="font-weight:700;padding:0 6px;border-radius:4px;'
        f'background:{TINTS["training"]}">ember</span>'
        f'<span style="font-weight:700">{escape(info.model_name)}</span>'
        f'<span style="opacity:0.75">{escape(about)}</span>'
        '<span style="opacity:0.75;font-family:var(--jp-code-font-family,monospace);'
        f'font-size:12px">{escape(info.artifact_dir)}</span>'
        '<span style="margin-left:auto;padding:1px 9px;border-radius:10px;font-weight:600;'
        f'background:{tint}">{escape(now)}</span>'
        "</div>"
    )


def _bar(fraction: float, colour: str) -> str:
    width = 100 * min(1.0, max(0.0, fraction))
    return (
        f'<div style="height:7px;border-radius:4px;background:{TRACK};overflow:hidden">'
        f'<div style="width:{width:.1f}%;height:100%;background:{colour}"></div></div>'
    )


def progress(snapshot: Snapshot) -> str:
    """The split's epoch bar and the whole run's bar, with speed and time."""
    where, within, position, timing = _progress_texts(snapshot)
    split = snapshot.progress.split if snapshot.progress else "train"
    overall = snapshot.fraction or 0.0
    return (
        '<div style="display:grid;grid-template-columns:max-content minmax(120px,1fr) '
        "max-content;gap:3px 10px;align-items:center;margin-top:8px;"
        'font-variant-numeric:tabular-nums">'
        f"<span>{escape(where)}</span>{_bar(within, COLOURS.get(split, COLOURS['train']))}"
        f'<span style="opacity:0.8">{escape(position)}</span>'
        f"<span>total</span>{_bar(overall, TOTAL_COLOUR)}"
        f'<span style="opacity:0.8">{100 * overall:.1f}% · {escape(timing)}</span>'
        "</div>"
    )


_CELL = "padding:2px 10px;border:none;background:none;"


def table(snapshot: Snapshot) -> str:
    """Each metric's last iteration value and epoch value per split."""
    rows = table_rows(snapshot)
    if not rows:
        return '<div style="margin-top:8px;opacity:0.7">no metric registered</div>'
    head = [f'<th style="{_CELL}text-align:left;border-bottom:1px solid {FRAME}">metric</th>']
    for split, kind in columns(snapshot):
        head.append(
            f'<th style="{_CELL}text-align:right;border-bottom:2px solid {COLOURS[split]}">'
            f"{escape(column_label(snapshot, split, kind))}</th>"
        )
    body = []
    for name, cells in rows:
        body.append(
            f'<tr style="background:none"><td style="{_CELL}text-align:left">{escape(name)}</td>'
            + "".join(f'<td style="{_CELL}text-align:right">{escape(c)}</td>' for c in cells)
            + "</tr>"
        )
    return (
        '<table style="border-collapse:collapse;margin:8px 0 4px;font-size:13px;'
        'font-variant-numeric:tabular-nums;color:inherit;background:none">'
        f"<thead><tr>{''.join(head)}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def legend(splits: tuple[str, ...] = ("train", "valid")) -> str:
    """The colour of each of `splits`, and what lines and markers stand for."""
    keys = "".join(
        f'<span><span style="display:inline-block;width:16px;height:3px;vertical-align:middle;'
        f'background:{COLOURS[split]}"></span> {split}</span>'
        for split in splits
    )
    return (
        '<div style="display:flex;flex-wrap:wrap;gap:4px 16px;margin:6px 0 4px;font-size:12px;'
        f'opacity:0.85">{keys}<span>lines: iteration values · dots and rings: epoch values · '
        "diamonds: validations inside epochs</span></div>"
    )


def charts(snapshot: Snapshot, series: Mapping[str, MetricSeries], hidden: int = 0) -> str:
    """Small multiples: one chart per metric of `series`, x in epochs."""
    if not series:
        return ""
    start = float(snapshot.info.start_epoch - 1)
    figures = []
    for name, (histories, epochs, points) in series.items():
        unit = snapshot.units.get(name, "")
        title = escape(name) + (
            f' <span style="opacity:0.6;font-weight:400">({escape(unit)})</span>' if unit else ""
        )
        figures.append(
            f'<div style="border:1px solid {FRAME};border-radius:4px;padding:4px 6px 2px">'
            f'<div style="font-weight:600;font-size:12px">{title}</div>'
            f"{chart(name, histories, epochs, start, unit, points)}</div>"
        )
    more = (
        f'<div style="margin-top:4px;font-size:12px;opacity:0.7">{hidden} more numeric '
        f"metric{'s' if hidden != 1 else ''} not charted</div>"
        if hidden
        else ""
    )
    drawn = {split for histories, epochs, _ in series.values() for split in [*histories, *epochs]}
    splits = tuple(split for split in SPLITS if split in drawn) or ("train", "valid")
    return (
        f'{legend(splits)}<div style="display:flex;flex-wrap:wrap;gap:10px">'
        f"{''.join(figures)}</div>{more}"
    )


def thin(x: np.ndarray, y: np.ndarray, points: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `points` points: means of consecutive groups of equal size."""
    if x.size <= points:
        return x, y
    size = math.ceil(x.size / points)
    starts = np.arange(0, x.size, size)
    counts = np.diff(np.append(starts, x.size))
    return np.add.reduceat(x, starts) / counts, np.add.reduceat(y, starts) / counts


def epoch_ticks(start: float, end: float) -> list[int]:
    """The epochs labelled on an axis from `start` to `end`: every 1, 2, 5, 10, 20...
    epochs, at most `MAX_TICKS` labels."""
    first, last = math.ceil(start), math.floor(end)
    scale = 1
    while True:
        for step in (1, 2, 5):
            every = step * scale
            if (last - first) / every <= MAX_TICKS - 1:
                return list(range(-(-first // every) * every, last + 1, every))
        scale *= 10


@dataclass(frozen=True)
class _Plot:
    """Maps data (x in epochs, y in the metric's unit) to the chart's pixels."""

    x0: float
    x1: float
    low: float
    high: float
    width: float = CHART_WIDTH - LEFT - RIGHT
    height: float = CHART_HEIGHT - TOP - BOTTOM

    def x(self, x: np.ndarray) -> np.ndarray:
        return LEFT + (np.asarray(x, dtype=np.float64) - self.x0) / (self.x1 - self.x0) * self.width

    def y(self, y: np.ndarray) -> np.ndarray:
        return (
            TOP
            + (self.high - np.asarray(y, dtype=np.float64)) / (self.high - self.low) * self.height
        )

    def points(self, x: np.ndarray, y: np.ndarray) -> str:
        """SVG `points`, to a tenth of a pixel."""
        pairs = zip(self.x(x).tolist(), self.y(y).tolist())
        return " ".join(f"{a:.1f},{b:.1f}" for a, b in pairs)


def _text(x: float, y: float, text: str, anchor: str = "middle", opacity: float = 0.7) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="currentColor" '
        f'fill-opacity="{opacity}">{escape(text)}</text>'
    )


def _frame(plot: _Plot) -> str:
    return (
        f'<rect x="{LEFT}" y="{TOP}" width="{plot.width}" height="{plot.height}" fill="none" '
        'stroke="currentColor" stroke-opacity="0.25"/>'
    )


def _axes(plot: _Plot) -> str:
    """The frame, a middle grid line, three y labels and the epoch ticks."""
    bottom, middle = TOP + plot.height, TOP + plot.height / 2
    parts = [
        _frame(plot),
        f'<line x1="{LEFT}" x2="{LEFT + plot.width}" y1="{middle}" y2="{middle}" '
        'stroke="currentColor" stroke-opacity="0.12"/>',
    ]
    values = [plot.high, (plot.high + plot.low) / 2, plot.low]
    for y, label in zip((TOP, middle, bottom), tick_labels(values)):
        if label:  # a label that would repeat the one above is left out
            parts.append(_text(LEFT - 4, y + 3.5, label, anchor="end"))
    for epoch in epoch_ticks(plot.x0, plot.x1):
        at = float(plot.x(np.array([epoch]))[0])
        parts.append(
            f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{bottom}" y2="{bottom + 3}" '
            'stroke="currentColor" stroke-opacity="0.5"/>'
        )
        parts.append(_text(at, bottom + 13, str(epoch)))
    parts.append(_text(2, bottom + 13, "epoch", anchor="start", opacity=0.55))
    return "".join(parts)


def _epoch_marks(plot: _Plot, split: str, values: list[tuple[int, float]], unit: str) -> str:
    """A split's epoch values: a marker each (with the value as its tooltip), or a dashed
    line when there are more than `MARKERS`."""
    x = np.array([epoch for epoch, _ in values], dtype=np.float64)
    y = np.array([value for _, value in values], dtype=np.float64)
    colour = COLOURS[split]
    if len(values) > MARKERS:
        return (
            f'<polyline points="{plot.points(*thin(x, y))}" fill="none" stroke="{colour}" '
            'stroke-width="1.6" stroke-dasharray="4 2"/>'
        )
    circles = "".join(
        f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{MARKER_RADIUS[split]}"><title>{split} epoch '
        f"{epoch}: {escape(format_number(value, unit))}</title></circle>"
        for cx, cy, (epoch, value) in zip(plot.x(x).tolist(), plot.y(y).tolist(), values)
    )
    return f"<g {MARKER_STYLE[split].format(colour=colour)}>{circles}</g>"


def _point_marks(plot: _Plot, points: Sequence[Mark], unit: str) -> str:
    """The validations inside epochs: a diamond each, where it ran and its value as its
    tooltip ("valid (epoch 2, iteration 400): 0.1286"); the latest `MARKERS` * 4."""
    shown = points[-MARKERS * 4 :]
    x = plot.x(np.array([at for at, _, _ in shown]))
    y = plot.y(np.array([value for _, value, _ in shown]))
    d = POINT_SIZE
    diamonds = "".join(
        f'<path d="M{cx:.1f} {cy - d:.1f}L{cx + d:.1f} {cy:.1f}L{cx:.1f} {cy + d:.1f}'
        f'L{cx - d:.1f} {cy:.1f}Z"><title>valid ({escape(where)}): '
        f"{escape(format_number(value, unit))}</title></path>"
        for cx, cy, (_, value, where) in zip(x.tolist(), y.tolist(), shown)
    )
    return f'<g fill="{COLOURS["valid"]}" fill-opacity="0.85">{diamonds}</g>'


def chart(
    name: str,
    histories: Mapping[str, HistoryView],
    epochs: Mapping[str, Mapping[int, float]],
    start: float,
    unit: str = "",
    points: Sequence[Mark] = (),
) -> str:
    """One metric as an inline SVG: each split's iteration values (bucket means, thinned
    to `POINTS`) as a line, its epoch values as markers, and its values at validations
    inside epochs (`points`, as (x, value)) as diamonds; x in epochs from `start`."""
    curves: list[tuple[str, np.ndarray, np.ndarray]] = []
    for split in SPLITS:
        history = histories.get(split)
        if history is not None and history.count:
            x, y = history.arrays()
            if x.size:
                curves.append((split, *thin(x, y)))
    marks = {
        split: sorted((e, v) for e, v in epochs.get(split, {}).items() if math.isfinite(v))
        for split in SPLITS
    }
    ends = [start + 1.0] + [float(x[-1]) for _, x, _ in curves]
    ends += [float(epoch) for values in marks.values() for epoch, _ in values]
    ends += [x for x, _, _ in points]
    ys = [y for _, _, y in curves] + [np.array([v for _, v in m]) for m in marks.values() if m]
    ys += [np.array([v for _, v, _ in points])] if points else []
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" '
        f'viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" role="img" aria-label="{escape(name)}" '
        'style="display:block;overflow:visible" font-family="sans-serif" font-size="10">'
    )
    if not ys:
        plot = _Plot(start, start + 1.0, 0.0, 1.0)
        waiting = _text(LEFT + plot.width / 2, TOP + plot.height / 2, "waiting for values")
        return f"{svg}{_frame(plot)}{waiting}</svg>"
    low, high = y_range(min(float(y.min()) for y in ys), max(float(y.max()) for y in ys))
    plot = _Plot(start, max(ends), low, high)
    parts = [svg, _axes(plot)]
    for split, x, y in curves:
        parts.append(
            f'<polyline points="{plot.points(x, y)}" fill="none" stroke="{COLOURS[split]}" '
            'stroke-width="1.4" stroke-linejoin="round" stroke-linecap="round" '
            'stroke-opacity="0.8"/>'
        )
    for split, values in marks.items():
        if values:
            parts.append(_epoch_marks(plot, split, values, unit))
    if points:
        parts.append(_point_marks(plot, points, unit))
    parts.append("</svg>")
    return "".join(parts)
