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

__all__ = ["colours", "legend_beside", "matplotlib", "save", "significant"]

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
