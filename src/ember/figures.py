"""What the PNG charts of `ember plot` and `ember compare` share: matplotlib (imported
only when a chart is drawn), legends beside the plotting area rather than over the
curves, one colour per series however many, and the numbers of every label written
with `ember.train.renderer.format.significant` (4 significant digits).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ember.errors import EmberError
from ember.train.renderer.format import significant

__all__ = ["colours", "legend_beside", "markers_whole", "matplotlib", "save", "significant"]

LEGEND_ROWS = 20
"""A legend beside the axes gets another column for every this many entries."""


def matplotlib(what: str = "Charts") -> tuple[Any, Any]:
    """matplotlib's `Figure` and its Agg canvas; an `EmberError` saying how to install
    matplotlib when it is missing (`what` names what needs it)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise EmberError(
            f"{what} needs matplotlib: pip install matplotlib (or pip install ember[plot])."
        ) from None
    return Figure, FigureCanvasAgg


def legend_beside(
    ax: Any,
    handles: Sequence[Any] | None = None,
    labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    bottom: bool = False,
    fontsize: float = 9,
) -> Any:
    """A legend to the right of `ax`, outside its plotting area, so that it never hides
    a curve: top-aligned (`bottom`: bottom-aligned), a column more for every
    `LEGEND_ROWS` entries. A figure with `layout="constrained"` makes room for it. For
    a second legend, keep the first with `ax.add_artist(first)` (matplotlib's axes have
    one legend of their own): the last one made is the one the layout makes room for."""
    if handles is None or labels is None:
        handles, labels = ax.get_legend_handles_labels()
    return ax.legend(
        handles,
        labels,
        loc="lower left" if bottom else "upper left",
        bbox_to_anchor=(1.02, 0.0 if bottom else 1.0),
        borderaxespad=0.0,
        ncols=math.ceil(max(1, len(labels)) / LEGEND_ROWS),
        fontsize=fontsize,
        title=title,
        title_fontsize=fontsize,
        frameon=False,
    )


def markers_whole(ax: Any) -> None:
    """Widen the limits of `ax` (linear axes) so that every marker of its lines is drawn
    whole inside the frame: a point at the edge of the data (the last validation of a
    run) is not cut in half, whatever the margins matplotlib's style gives. The figure
    is laid out first, to know the plotting area in pixels; limits never shrink."""
    marked = [
        line
        for line in ax.get_lines()
        if line.get_marker() not in (None, "None", "none", "", " ") and len(line.get_xdata())
    ]
    if not marked:
        return
    figure = ax.get_figure()
    figure.draw_without_rendering()  # the layout: the plotting area's size in pixels
    box = ax.get_window_extent()
    radius = 3 + max(  # a few pixels of air between a marker and the frame
        (line.get_markersize() / 2 + line.get_markeredgewidth()) * figure.dpi / 72
        for line in marked
    )
    axes = (
        ("x", [x for line in marked for x in line.get_xdata()], box.width, ax.get_xlim),
        ("y", [y for line in marked for y in line.get_ydata()], box.height, ax.get_ylim),
    )
    for name, values, pixels, limits in axes:
        if getattr(ax, f"get_{name}scale")() != "linear":
            continue
        finite = [float(v) for v in values if math.isfinite(float(v))]
        if not finite or pixels <= 4 * radius:
            continue
        low, high = limits()
        first, last = min(finite), max(finite)
        scale = pixels / (high - low) if high > low else 0.0
        if scale and (first - low) * scale >= radius and (high - last) * scale >= radius:
            continue  # the margins hold the markers already
        span = max(high, last) - min(low, first)
        pad = radius * span / (pixels - 2 * radius)
        setter = getattr(ax, f"set_{name}lim")
        setter(min(low, first - pad), max(high, last + pad))


def colours(count: int) -> list[Any]:
    """`count` colours that tell the series apart: matplotlib's ten by default, its
    twenty paired ones up to 20, else as many spread over a perceptual colour map."""
    from matplotlib import colormaps

    if count <= 10:
        return [f"C{index}" for index in range(count)]
    if count <= 20:
        table = colormaps["tab20"]
        return [table(index) for index in range(count)]
    spread = colormaps["turbo"]
    return [spread(0.05 + 0.9 * index / (count - 1)) for index in range(count)]


def save(figure: Any, path: Path) -> Path:
    """Write `figure` as a PNG at 100 dpi (drawn on matplotlib's Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=100)
    return path
