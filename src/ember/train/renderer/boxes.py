"""The frame of a dashboard panel: a line cropped or padded to a width, a rounded box
with a title and a subtitle around lines, two columns of lines side by side, and the
styles the panels share."""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len, set_cell_size

from ember.train.renderer.charts import Line

SPLIT_STYLES = {"train": "cyan", "valid": "magenta", "test": "green"}
BORDER = "grey42"
LABEL = "grey62"


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
