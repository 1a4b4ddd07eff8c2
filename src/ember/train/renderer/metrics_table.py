"""The dashboard's metrics panel: each metric's last training value, its training
epoch value and its latest validation value, each column saying which epoch (and
point) its values belong to; in full where the panel is wide enough, else as short
numbers with the least useful columns left out, scrolled to keep the selected metric
in view."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size

from ember.train.renderer.boxes import BORDER, LABEL, SPLIT_STYLES, box, fit
from ember.train.renderer.charts import Line
from ember.train.renderer.format import format_compact
from ember.train.renderer.state import (
    SPLITS,
    Snapshot,
    cell_text,
    column_label,
    columns,
    metric_rows,
    shown_value,
    value_epoch,
    where_text,
)

_COLUMN_PRIORITY = (("train", "last"), ("valid", "epoch"), ("train", "epoch"))
CELL = 12
SHORT_CELL = 8
"""The width of a short number ("0.5123", "1.235e-5"): columns keep it as values change."""
NAME_MIN = 10
"""The fewest cells a metric's name is cut to (with "…") before columns are left out."""
Table = tuple[Line, Line, list[Line], int]
"""A metrics table: the box title, the header line, a line per metric, and how many
columns it leaves out."""


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


def _splits(snapshot: Snapshot, rows: list) -> list[str]:
    """The splits the table has columns for: those with a metric (both when none has)."""
    present = {split for _, _, splits in rows for split in splits}
    present |= {split for split, _, _, _ in snapshot.info.metrics}
    return [split for split in SPLITS if split in present] or ["train", "valid"]


def _table(snapshot: Snapshot, rows: list, inner: int) -> Table:
    """The metrics table in `inner` cells. Every value is shown whole: in full with its
    unit ("91.23 %") under headers "train last", "train (epoch 3)", "valid (epoch 2,
    iteration 400)" where that fits, else as short numbers (`_short_table`)."""
    splits = _splits(snapshot, rows)
    shown = [column for column in columns(snapshot) if column[0] in splits]
    need = max((2 + cell_len(name) for name, _, _ in rows), default=8)  # "▸ " + name
    labels = [column_label(snapshot, split, kind) for split, kind in shown]
    full = [
        [cell_text(snapshot, row_splits.get(split), kind, unit) for _, unit, row_splits in rows]
        for split, kind in shown
    ]
    widths = [
        max([CELL - 1, cell_len(label), *(cell_len(text) for text in texts)])
        for label, texts in zip(labels, full)
    ]
    name_w = inner - sum(1 + w for w in widths)
    if need > name_w:
        return _short_table(snapshot, rows, inner, splits, shown, need)
    head: Line = [(set_cell_size("  metric", name_w), "bold")]
    head += [(f" {label}".rjust(1 + w), "bold") for label, w in zip(labels, widths)]
    lines = []
    for index, (name, _, _) in enumerate(rows):
        line = _name_cell(snapshot, name, "", name_w)
        line += [
            (" " + texts[index].rjust(w), SPLIT_STYLES[split])
            for (split, _), texts, w in zip(shown, full, widths)
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
    """The metrics table with values in at most 8 characters ("91.23", "1.235e-5")
    under "last" and the epoch the values belong to ("epoch 3", "ep 2 it 400": the
    validation after 400 training batches of epoch 2), each split named in the box's
    top border above its columns, and units after the metrics' names where they fit.
    Names that still do not fit are cut with "…"; only then are columns left out, the
    least useful first."""
    short = [
        [
            format_compact(shown_value(snapshot, row_splits[split], kind))
            if split in row_splits
            else ""
            for _, _, row_splits in rows
        ]
        for split, kind in columns
    ]
    heads = [
        "last" if kind == "last" else where_text(value_epoch(snapshot, split), True) or "epoch"
        for split, kind in columns
    ]
    widths = [
        max([SHORT_CELL, cell_len(head), *(cell_len(text) for text in texts)])
        for head, texts in zip(heads, short)
    ]
    kept = list(range(len(columns)))
    dropping = [columns.index(c) for c in reversed(_COLUMN_PRIORITY) if c in columns]
    while kept and min(need, NAME_MIN) + sum(1 + widths[i] for i in kept) > inner:
        kept.remove(dropping.pop(0))
    name_w = max(1, inner - sum(1 + widths[i] for i in kept))
    head: Line = [(set_cell_size("  metric", name_w), "bold")]
    head += [(heads[i].rjust(1 + widths[i]), "bold") for i in kept]
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
